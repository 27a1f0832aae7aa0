"""A cluster's exporters and Prometheus for ``analyze --prometheus`` tests.

- :class:`FakeProm`: a stdlib HTTP server that answers Prometheus' API the way a
  broken or odd Prometheus would (per request kind: ``ok``, ``error``, ``timeout_doc``,
  ``slow``, ``warnings``, ``garbage``, ``many``), with canned series for the job's hosts;
  ``relabelled`` names instances by IP address and hosts in upper case with a domain;
  ``offset_s``: the agents learned the logs' clock is that far from UTC; ``clean``: no
  error counter moved (``changed`` answers nothing); ``auth``: the Authorization header
  a login proxy in front wants (else a 401 page).
- :class:`NodeExporter`: Debian's ``prometheus-node-exporter`` reading a sysfs tree built
  here as the kernel lays out ``class/infiniband/<dev>/ports/<n>/counters``, its node's
  name from a textfile ``node_uname_info`` (every exporter of a test runs on this one
  machine); :meth:`NodeExporter.bump` raises a counter as a flapping port would.
- :class:`DcgmStandIn`: dcgm-exporter's names and labels (``gpu``, ``UUID``, ``device``,
  ``modelName``, ``Hostname``; etc/default-counters.csv's fields) served by
  prometheus_client, as DCGM needs a GPU; it serves the agent's identity and GPU memory
  series too (``ncclscope_node_info``, ``ncclscope_gpu_memory_used_bytes``).
- :func:`stamped_log`: the sample log with NCCL's ``[%F %T.%6f]`` stamps at a given
  UTC time.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

from conftest import sample_lines
from prom import free_port, stop

# ----------------------------------------------------------------------------- logs


def stamped_log(path: Path, at: datetime, *, step: timedelta = timedelta(milliseconds=50)) -> Path:
    """The sample log (hosts ``node-a``, ``node-b``) with every NCCL line stamped from
    ``at`` (UTC) on, ``step`` apart, as ``NCCL_DEBUG_TIMESTAMP_FORMAT="[%F %T.%6f] "``."""
    out = []
    t = at.astimezone(UTC).replace(tzinfo=None)
    for line in sample_lines():
        if line.rank is None:
            out.append(line.text)
        else:
            out.append(f"[{t:%Y-%m-%d %H:%M:%S.%f}] {line.text}")
            t += step
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- fake


def request_kind(endpoint: str, query: str) -> str:
    """Which of ``read_cluster``'s requests a query is (its ``Ask.what``)."""
    if endpoint == "series":
        return "identity"
    marks = (
        ("zone", "last_over_time(ncclscope_log_utc_offset_seconds"),
        ("changed", "changes(node_infiniband_"),
        ("ports_errors", "node_infiniband_symbol_error_total"),
        ("ports_rates", "node_infiniband_port_transmit_wait_total"),
        ("ports_state", "node_infiniband_state_id"),
        ("ports_static", "node_infiniband_rate_bytes_per_second"),
        ("gpus_events", "DCGM_FI_DEV_XID_ERRORS"),
        ("gpus_gauges", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
        ("agent_static", "ncclscope_gpu_memory_total_bytes"),
        ("agent", "ncclscope_gpu_memory_used_bytes"),
    )
    return next((what for what, mark in marks if mark in query), "other")


def _tagged(metric: str, kind: str, **labels: str) -> dict[str, str]:
    return {"ncclscope_metric": f"{kind}:{metric}", **labels}


class FakeProm:
    """Prometheus' API, answered from canned series for ``hosts`` (and an unrelated
    ``other-1``); ``modes`` maps a request kind (:func:`request_kind`) to how it is
    answered.  ``requests`` counts what was asked, by kind."""

    def __init__(
        self,
        hosts: tuple[str, ...] = ("node-a", "node-b"),
        *,
        modes: dict[str, str] | None = None,
        relabelled: bool = False,
        delay_s: float = 3.0,
        many: int = 50,
        offset_s: float | None = None,
        clean: bool = False,
        auth: str | None = None,
    ) -> None:
        self.hosts = hosts
        self.clean = clean
        self.auth = auth
        self.authorizations: set[str] = set()  # the Authorization headers received
        self.offset_s = offset_s
        self.modes = modes or {}
        self.relabelled = relabelled
        self.delay_s = delay_s
        self.many = many
        self.requests: dict[str, int] = {}
        self.timeouts: set[str] = set()  # Prometheus' ``timeout`` parameters received
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                params = urllib.parse.parse_qs(self.rfile.read(size).decode())
                self._answer(params)

            def do_GET(self) -> None:
                self._answer(urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query))

            def _answer(self, params: dict[str, list[str]]) -> None:
                endpoint = urllib.parse.urlsplit(self.path).path.rsplit("/", 1)[-1]
                said = self.headers.get("Authorization")
                if said:
                    fake.authorizations.add(said)
                if fake.auth is not None and said != fake.auth:  # a login proxy's page
                    code, body = 401, b"<html><body>401 Authorization Required</body></html>"
                else:
                    code, body = fake.answer(endpoint, params)
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # shutdown() waits for the loop's next poll: 0.05 s, not the default 0.5 s
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --------------------------------------------------------------- answers

    def answer(self, endpoint: str, params: dict[str, list[str]]) -> tuple[int, bytes]:
        query = params.get("query") or params.get("match[]") or [""]
        what = request_kind(endpoint, " ".join(query))
        self.requests[what] = self.requests.get(what, 0) + 1
        self.timeouts.update(params.get("timeout", []))
        mode = self.modes.get(what, self.modes.get("*", "ok"))
        if mode == "slow":
            time.sleep(self.delay_s)
        if mode == "error":
            doc = {"status": "error", "errorType": "bad_data", "error": "parse error at char 1"}
            return 400, json.dumps(doc).encode()
        if mode == "timeout_doc":
            doc = {"status": "error", "errorType": "timeout", "error": "query timed out"}
            return 503, json.dumps(doc).encode()
        if mode == "garbage":
            return 200, b"<html>a proxy's error page</html>"
        if endpoint == "series":
            data: Any = self.identity()
        elif what == "zone":
            data = {"resultType": "vector", "result": self.zone(params)}
        elif what == "changed":
            data = {"resultType": "vector", "result": self.changed(params)}
        else:
            result = many_series(self.many) if mode == "many" else self.matrix(what, params)
            data = {"resultType": "matrix", "result": result}
        doc = {"status": "success", "data": data}
        if mode == "warnings":
            doc["warnings"] = ["remote read of store-2 failed: partial data"]
        return 200, json.dumps(doc).encode()

    def _inst(self, k: int, port: int) -> str:
        return f"10.0.0.{k + 1}:{port}" if self.relabelled else f"{self.hosts[k]}:{port}"

    def _name(self, host: str) -> str:
        return f"{host.upper()}.cluster.local" if self.relabelled else host

    def identity(self) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for k, h in enumerate(self.hosts):
            node, dcgm, agent = self._inst(k, 9100), self._inst(k, 9400), self._inst(k, 9477)
            out += [
                {"__name__": "up", "instance": node, "job": "node"},
                {"__name__": "up", "instance": dcgm, "job": "dcgm"},
                {"__name__": "up", "instance": agent, "job": "ncclscope"},
                {"__name__": "node_uname_info", "instance": node, "job": "node",
                 "nodename": self._name(h)},
                {"__name__": "ncclscope_node_info", "instance": agent, "job": "ncclscope",
                 "hostname": self._name(h)},
            ]  # fmt: skip
            if not self.relabelled:  # dcgm-exporter without Hostname: IPs only
                out.append({"__name__": "DCGM_FI_DEV_XID_ERRORS", "instance": dcgm,
                            "job": "dcgm", "Hostname": h, "gpu": "0"})  # fmt: skip
        out += [
            {"__name__": "up", "instance": "other-1:9100", "job": "node"},
            {"__name__": "node_uname_info", "instance": "other-1:9100", "job": "node",
             "nodename": "other-1"},
            {"__name__": "up", "instance": "10.9.9.9:9100", "job": "node"},
        ]  # fmt: skip
        return out

    def zone(self, params: dict[str, list[str]]) -> list[dict[str, Any]]:
        """The agents' learned offset and their hosts, as ``agents_zone``'s instant query
        returns them (nothing where no ``offset_s``: an agent that learned none)."""
        if self.offset_s is None:
            return []
        at = float(params.get("time", ["0"])[0])
        out: list[dict[str, Any]] = []
        for k, h in enumerate(self.hosts):
            agent = {"instance": self._inst(k, 9477), "job": "ncclscope"}
            out += [
                {"metric": {**agent, "ncclscope_metric": "offset"},
                 "value": [at, f"{self.offset_s}"]},
                {"metric": {**agent, "hostname": self._name(h), "ncclscope_metric": "host"},
                 "value": [at, "1"]},
            ]  # fmt: skip
        return out

    def changed(self, params: dict[str, list[str]]) -> list[dict[str, Any]]:
        """The instances whose counters moved (``read_cluster``'s ``changed``): the first
        host's port (its errors below) and the last host's GPU (its XID)."""
        at = float(params.get("time", ["0"])[0])
        if self.clean:
            return []
        return [
            {"metric": {"instance": self._inst(0, 9100), "job": "node", "device": "mlx5_0",
                        "port": "1", "ncclscope_metric": "ports"}, "value": [at, "2"]},
            {"metric": {"instance": self._inst(len(self.hosts) - 1, 9400), "job": "dcgm",
                        "gpu": "0", "ncclscope_metric": "gpus"}, "value": [at, "79"]},
        ]  # fmt: skip

    def matrix(self, what: str, params: dict[str, list[str]]) -> list[dict[str, Any]]:
        start = float(params.get("start", ["0"])[0])
        end = float(params.get("end", ["0"])[0])
        step = float(params.get("step", ["15"])[0])
        times = [start + k * step for k in range(min(int((end - start) / step) + 1, 40))]

        def series(labels: dict[str, str], values: list[str] | str) -> dict[str, Any]:
            vals = values if isinstance(values, list) else [values] * len(times)
            return {"metric": labels, "values": [[t, v] for t, v in zip(times, vals, strict=False)]}

        _a, b = self.hosts[0], self.hosts[-1]
        ia, ib = self._inst(0, 9100), self._inst(len(self.hosts) - 1, 9100)
        port = {"device": "mlx5_0", "port": "1", "job": "node"}
        if what == "ports_errors":
            return [
                {"metric": _tagged("symbol_error_total", "increase", instance=ia, **port),
                 "values": [[times[1], "3"], [times[2], "5"]]},
                {"metric": _tagged("link_error_recovery_total", "increase", instance=ia, **port),
                 "values": [[times[2], "1"]]},
            ]  # fmt: skip
        if what == "ports_rates":
            return [
                series(_tagged(m, "rate_per_s", instance=i, **port), v)
                for i in (ia, ib)
                for m, v in (("port_transmit_wait_total", "12.5"),
                             ("port_data_transmitted_bytes_total", "1e9"))
            ]  # fmt: skip
        if what == "ports_state":
            return [{"metric": _tagged("state_id", "gauge", instance=ib, **port),
                     "values": [[times[3], "1"]]}]  # fmt: skip
        if what == "ports_static":
            return [series({"__name__": "node_infiniband_rate_bytes_per_second", "instance": i,
                            **port}, "2.5e10") for i in (ia, ib)]  # fmt: skip
        dcgm = {"gpu": "0", "UUID": "GPU-0b", "device": "nvidia0", "modelName": "NVIDIA H100",
                "job": "dcgm"}  # fmt: skip
        if what == "gpus_events":
            if self.relabelled:
                return []
            return [
                {"metric": _tagged("DCGM_FI_DEV_XID_ERRORS", "gauge",
                                   instance=self._inst(len(self.hosts) - 1, 9400), Hostname=b,
                                   **dcgm),
                 "values": [[times[2], "79"], [times[3], "79"]]},
            ]  # fmt: skip
        if what == "gpus_gauges":
            vals = ["0"] * len(times)
            vals[1], vals[2] = "NaN", "+Inf"
            named = {} if self.relabelled else {"Hostname": ""}
            return [
                series({"__name__": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                        "instance": self._inst(k, 9400),
                        **{n: h for n in named}, **dcgm}, vals)
                for k, h in enumerate(self.hosts)
            ]  # fmt: skip
        agent = {"gpu": "0", "UUID": "GPU-0a", "pci_bus_id": "00000000:18:00.0",
                 "job": "ncclscope"}  # fmt: skip
        if what == "agent":
            return [
                series({"__name__": "ncclscope_gpu_memory_used_bytes",
                        "instance": self._inst(k, 9477), **agent}, "4.0e10")
                for k in range(len(self.hosts))
            ]  # fmt: skip
        if what == "agent_static":
            offset = [
                series({"__name__": "ncclscope_log_utc_offset_seconds",
                        "instance": self._inst(k, 9477), "job": "ncclscope"}, f"{self.offset_s}")
                for k in range(len(self.hosts))
            ] if self.offset_s is not None else []  # fmt: skip
            return [
                series({"__name__": "ncclscope_gpu_memory_total_bytes",
                        "instance": self._inst(k, 9477), **agent}, "8.0e10")
                for k in range(len(self.hosts))
            ] + offset  # fmt: skip
        return []


def many_series(n: int) -> list[dict[str, Any]]:
    return [{"metric": {"__name__": "x", "i": str(k)}, "values": [[1.0, "1"]]} for k in range(n)]


# ----------------------------------------------------------------------------- real


#: Every counter file the kernel's mlx5 driver writes under ports/<n>/counters that
#: node_exporter 1.5 reads (``port_xmit_data`` and ``port_rcv_data`` in 4-byte words).
IB_COUNTERS = (
    "symbol_error", "link_downed", "link_error_recovery", "port_xmit_wait", "port_rcv_errors",
    "port_xmit_discards", "port_rcv_remote_physical_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "port_xmit_data", "port_rcv_data", "port_xmit_packets",
    "port_rcv_packets", "port_rcv_constraint_errors", "port_xmit_constraint_errors",
    "VL15_dropped",
)  # fmt: skip


class NodeExporter:
    """``prometheus-node-exporter`` for one node ``host``: its InfiniBand collector on a
    sysfs tree under ``folder`` (``devices`` HCAs of one port each), its name in a
    textfile ``node_uname_info``."""

    def __init__(self, binary: str, folder: Path, host: str, devices: int = 2) -> None:
        self.sysfs = folder / "sys"
        self.devices = [f"mlx5_{k}" for k in range(devices)]
        for dev in self.devices:
            d = self.sysfs / "class" / "infiniband" / dev
            (d / "ports" / "1" / "counters").mkdir(parents=True)
            for name, text in (
                ("hca_type", "MT4123"),
                ("fw_ver", "20.31.1014"),
                ("board_id", "MT_0000000223"),
                ("node_guid", "0c42:a103:0003:1234"),
            ):
                (d / name).write_text(text + "\n")  # fmt: skip
            port = d / "ports" / "1"
            (port / "state").write_text("4: ACTIVE\n")
            (port / "phys_state").write_text("5: LinkUp\n")
            (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
            for c in IB_COUNTERS:
                (port / "counters" / c).write_text("0\n")
        text = folder / "textfile"
        text.mkdir()
        (text / "uname.prom").write_text(
            f'node_uname_info{{nodename="{host}",sysname="Linux",release="6.1.0",'
            'version="#1",machine="x86_64",domainname="(none)"} 1\n'
        )
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._log: BinaryIO = (folder / "node_exporter.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--path.sysfs={self.sysfs}", "--collector.disable-defaults",
             "--collector.infiniband", "--collector.textfile",
             f"--collector.textfile.directory={text}", f"--web.listen-address={self.address}"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def counter(self, device: str, name: str) -> Path:
        return self.sysfs / "class" / "infiniband" / device / "ports" / "1" / "counters" / name

    def bump(self, device: str, name: str, by: int) -> None:
        """Raise a counter, as the HCA's firmware would (written whole, then renamed)."""
        path = self.counter(device, name)
        value = int(path.read_text()) + by
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{value}\n")
        tmp.rename(path)

    def close(self) -> None:
        stop(self.proc)
        self._log.close()


class DcgmStandIn:
    """dcgm-exporter's series for ``gpus`` GPUs of ``host`` (and the agent's identity and
    GPU memory), served by prometheus_client on a free loopback port; ``host_label``:
    ``Hostname``, or ``hostname`` as dcgm-exporter spells it since May 2026."""

    def __init__(self, host: str, gpus: int = 2, host_label: str = "Hostname") -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        labels = ["gpu", "UUID", "device", "modelName", host_label]
        # dcgm-exporter exposes every field as a gauge (counters too: their values as read).
        self.fields = {
            name: Gauge(name, help_, labels, registry=self.registry)
            for name, help_ in (
                ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
                ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
                ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
                ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries."),
            )
        }
        self.gpus = [
            (str(k), f"GPU-{host}-{k:04d}", f"nvidia{k}", "NVIDIA H100 80GB HBM3", host)
            for k in range(gpus)
        ]
        for g in self.gpus:
            self.fields["DCGM_FI_DEV_XID_ERRORS"].labels(*g).set(0)
            self.fields["DCGM_FI_DEV_SM_CLOCK"].labels(*g).set(1980)
            self.fields["DCGM_FI_DEV_GPU_TEMP"].labels(*g).set(41)
            self.fields["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"].labels(*g).set(0)
        agent = Gauge("ncclscope_node_info", "The host the agent runs on.", ["hostname"],
                      registry=self.registry)  # fmt: skip
        agent.labels(host).set(1)
        used = Gauge("ncclscope_gpu_memory_used_bytes", "GPU memory in use.",
                     ["gpu", "UUID", "pci_bus_id"], registry=self.registry)  # fmt: skip
        for k, g in enumerate(self.gpus):
            used.labels(g[0], g[1], f"00000000:{0x18 + k:02X}:00.0").set(3.0e10)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.server, _thread = start_http_server(self.port, "127.0.0.1", self.registry)

    def set(self, field: str, gpu: int, value: float) -> None:
        self.fields[field].labels(*self.gpus[gpu]).set(value)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape_config(path: Path, jobs: dict[str, list[str]], interval: str = "1s") -> Path:
    """A Prometheus config scraping each job's targets every ``interval``."""
    lines = ["global:", f"  scrape_interval: {interval}", f"  evaluation_interval: {interval}",
             "scrape_configs:"]  # fmt: skip
    for job, targets in jobs.items():
        lines += [f"  - job_name: {job}", "    static_configs:",
                  f"      - targets: [{', '.join(repr(t) for t in targets)}]"]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_for(check: Any, timeout_s: float = 15.0, every_s: float = 0.2) -> bool:
    """Poll ``check()`` until true or ``timeout_s``; its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
