"""A Prometheus serving a backfilled TSDB, for the benchmarks that read one
(``bench_cluster_queries.py``, ``bench_fabric_e2e.py``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


class Server:
    """A Prometheus serving ``tsdb`` on a free loopback port (retention long enough for
    the jobs' past times; no compaction of the backfilled blocks while it serves)."""

    def __init__(self, tsdb: Path, folder: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        config = folder / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = folder / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(shutil.which("prometheus")), f"--config.file={config}",
             f"--storage.tsdb.path={tsdb}", f"--web.listen-address=127.0.0.1:{port}",
             "--storage.tsdb.retention.time=36500d",
             "--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def ready(self, timeout_s: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
        return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
