"""A real Prometheus for tests: started on a free loopback port with a temporary TSDB,
queried over its HTTP API, stopped through its lifecycle endpoint.

Debian's ``prometheus`` package (``.ci/run`` installs it) provides ``prometheus`` and
``promtool``.  Locally a test skips without them; under CI (``CI`` set) it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

import pytest


def need(name: str, package: str) -> str:
    """A real component's binary, or skip (fail under CI: ``.ci/run`` installs it)."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing: .ci/run installs the {package} package")
        pytest.skip(f"{name} not installed (apt-get install {package})")
    return found


def tools() -> tuple[str, str]:
    """``prometheus`` and ``promtool``, or skip (fail under CI)."""
    return need("prometheus", "prometheus"), need("promtool", "prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(base: str, path: str, **params: str) -> Any:
    """A JSON answer of Prometheus' API (its error document on an HTTP error)."""
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)
    except urllib.error.HTTPError as err:
        return json.load(err)


def stop(proc: subprocess.Popen[bytes], how: signal.Signals = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(how)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Prometheus:
    """One Prometheus server with ``config``; ``base`` is its URL."""

    def __init__(self, binary: str, config: Path, folder: Path, retention: str = "1h") -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = folder / "prometheus.log"
        self._log: BinaryIO = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
             f"--storage.tsdb.retention.time={retention}"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def ready(self, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.base}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
        return False

    def alerts(self) -> list[dict[str, Any]]:
        try:
            return list(get(self.base, "/api/v1/alerts")["data"]["alerts"])
        except (urllib.error.URLError, ConnectionError, KeyError):
            return []

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = get(self.base, "/api/v1/query", query=expr)
        return list(answer.get("data", {}).get("result", []))

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def close(self) -> int | None:
        """Quit through the lifecycle endpoint, SIGTERM if that did not work."""
        try:
            urllib.request.urlopen(
                urllib.request.Request(f"{self.base}/-/quit", method="POST"), timeout=5
            )
            self.proc.wait(timeout=10)
        except (urllib.error.URLError, ConnectionError, subprocess.TimeoutExpired):
            pass
        stop(self.proc)
        self._log.close()
        return self.proc.returncode
