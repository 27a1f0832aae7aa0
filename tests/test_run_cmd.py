"""``ncclscope run -- CMD``: with real child processes (issue #15).

A job that prints recorded log lines over time on stdout and stderr, one that hangs
until a signal comes, one that kills itself; what they saw (their environment), what
reached the terminal and ``DIR``, the exit status and the summary at the end.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from ncclscope.agent.launch import (
    SETTINGS,
    Tee,
    exit_status,
    job_environment,
    settings_markdown,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "missing-rank-hang" / "train.log"
#: A stamp the tee writes in front of an NCCL header.
STAMP_RE = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] (?=\S+:\d+:\d+ )")

#: The job: prints the fixture's lines over ~0.4 s (PyTorch's on stderr, the rest on
#: stdout), waits for the test to scrape the metrics, ends with a line without newline.
PRINTER = """
import json, os, sys, time
from pathlib import Path
lines = Path(sys.argv[1]).read_text().splitlines()
Path(sys.argv[2]).write_text(json.dumps(dict(os.environ)))
go = Path(sys.argv[3])
for k, line in enumerate(lines):
    err = "ProcessGroupNCCL" in line or "elastic" in line
    (sys.stderr if err else sys.stdout).write(line + "\\n")
    if k % 20 == 0:
        time.sleep(0.05)
    if k == len(lines) // 2:
        deadline = time.monotonic() + 20
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
sys.stdout.write("the last words, without a newline")
os._exit(3)
"""

#: The job that hangs: it and a child of its own wait; each notes the signals it gets.
HANGER = """
import os, signal, subprocess, sys, time
from pathlib import Path
marks = Path(sys.argv[1])
def noted(name):
    def handler(signum, frame):
        (marks / name).write_text(signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    return handler
if len(sys.argv) > 2:
    signal.signal(signal.SIGTERM, noted("grandchild"))
    (marks / "grandchild.ready").write_text("")
    time.sleep(60)
signal.signal(signal.SIGTERM, noted("child"))
kid = subprocess.Popen([sys.executable, __file__, str(marks), "grandchild"])
print("waiting", flush=True)
(marks / "child.ready").write_text("")
time.sleep(60)
"""

#: The job that is killed: lines, then SIGKILL to itself.
KILLED = """
import json, os, signal, sys
from pathlib import Path
Path(sys.argv[1]).write_text(json.dumps(dict(os.environ)))
for k in range(500):
    print(f"step {k} loss 2.{k:04d}")
print("the last line before the kill")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    """The environment ncclscope run starts in: none of the settings set, but ``extra``."""
    env = {k: v for k, v in os.environ.items() if not any(k in s.names for s in SETTINGS)}
    return env | extra


def _start(out: Path, script: Path, *args: str, options: tuple[str, ...] = (),
           env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
    cmd = [sys.executable, "-m", "ncclscope", "run", "--out", str(out), "--interval", "0.2",
           *options, "--", sys.executable, str(script), *args]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or _env(), cwd=ROOT
    )


def _unstamped(line: str) -> str:
    return STAMP_RE.sub("", line, count=1)


def test_a_job_is_teed_watched_analysed_and_its_status_returned(tmp_path: Path) -> None:
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    out, seen, go = tmp_path / "run", tmp_path / "env.json", tmp_path / "go"
    port = _free_port()
    proc = _start(
        out, script, str(FIXTURE), str(seen), str(go),
        options=("--listen", f"127.0.0.1:{port}", "--analyse-every", "0.2"),
        env=_env(NCCL_DEBUG="WARN", TORCH_NCCL_TRACE_BUFFER_SIZE="500"),
    )  # fmt: skip
    # While the job runs (it waits for "go"), its lines are on /metrics.
    lines_read = re.compile(r"^ncclscope_log_lines_read_total [1-9]", re.M)
    deadline, metrics = time.monotonic() + 20, ""
    while time.monotonic() < deadline and not lines_read.search(metrics):
        time.sleep(0.1)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                metrics = r.read().decode()
        except OSError:  # not serving yet
            continue
    go.write_text("")
    stdout, stderr = proc.communicate(timeout=60)
    assert lines_read.search(metrics)
    assert "ncclscope_host_memory_total_bytes" in metrics
    assert proc.returncode == 3

    # What the job saw: ncclscope's settings, and the user's own where they had some.
    env = json.loads(seen.read_text())
    assert env["NCCL_DEBUG"] == "WARN"
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT,ENV,COLL"
    assert env["NCCL_DEBUG_FILE"] == f"{out.resolve()}/nccl/%h.%p.log"
    assert env["NCCL_DEBUG_TIMESTAMP_LEVELS"] == "WARN,INFO"
    assert env["NCCL_DEBUG_TIMESTAMP_FORMAT"] == "[%F %T.%6f] "
    assert env["TZ"] == "UTC"
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "500"
    assert "TORCH_FR_BUFFER_SIZE" not in env  # it would win over the user's older name
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    prefix = f"{out.resolve()}/flight/nccl_trace_rank_"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
    assert env["PYTHONUNBUFFERED"] == "1"

    # The terminal got each stream's bytes unchanged, in order; then the summary.
    printed = FIXTURE.read_text().splitlines()
    on_err = [x for x in printed if "ProcessGroupNCCL" in x or "elastic" in x]
    on_out = [x for x in printed if x not in on_err]
    expect_out = "".join(x + "\n" for x in on_out) + "the last words, without a newline"
    assert stdout.decode().startswith(expect_out)
    err_lines = stderr.decode().splitlines()
    assert [x for x in err_lines if not x.startswith("ncclscope run:")] == on_err

    # DIR/output.log: every line, both streams, NCCL lines stamped with their arrival.
    log = (out / "output.log").read_text().splitlines()
    assert Counter(_unstamped(x) for x in log) == Counter(
        [*printed, "the last words, without a newline"]
    )
    assert log[-1] == "the last words, without a newline"
    nccl = [x for x in log if " NCCL INFO " in x]
    assert nccl
    assert all(STAMP_RE.search(x) for x in nccl)
    first = datetime.strptime(nccl[0].split("]:[", 1)[1][:26], "%Y-%m-%d %H:%M:%S.%f")
    assert abs((datetime.now() - first).total_seconds()) < 60  # local time, like NCCL's
    assert not any(STAMP_RE.search(x) for x in log if " NCCL " not in x)

    record = json.loads((out / "run.json").read_text())
    assert record["exit_status"] == 3
    assert record["output"]["lines"] == len(printed) + 1
    assert record["kept"] == {"NCCL_DEBUG": "WARN", "TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}
    assert sorted(p.name for p in out.iterdir()) == [
        "flight", "nccl", "output.log", "run.json", "telemetry"
    ]  # fmt: skip
    assert list((out / "telemetry").glob("part-*.parquet"))

    # The analysis of DIR, as analyze prints it.
    summary = stdout.decode()[len(expect_out) :]
    assert "rank 2 never joined AllReduce #11" in summary
    assert "TELEMETRY" in summary
    assert "the job exited with 3" in stderr.decode()


def test_sigterm_reaches_the_whole_job_and_its_status_is_128_plus_15(tmp_path: Path) -> None:
    script = tmp_path / "hanger.py"
    script.write_text(HANGER)
    marks = tmp_path / "marks"
    marks.mkdir()
    out = tmp_path / "run"
    proc = _start(out, script, str(marks), options=("--no-agent", "--no-summary"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (
        (marks / "child.ready").exists() and (marks / "grandchild.ready").exists()
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert (marks / "child").read_text() == "SIGTERM"
    assert (marks / "grandchild").read_text() == "SIGTERM"  # the group, not just the child
    assert proc.returncode == 143 == exit_status(-signal.SIGTERM)
    assert stdout.decode() == "waiting\n"
    assert "the job exited with 143 (signal SIGTERM)" in stderr.decode()
    record = json.loads((out / "run.json").read_text())
    assert record["signals_forwarded"] == ["SIGTERM"]
    assert (out / "output.log").read_text() == "waiting\n"
    assert list((out / "telemetry").iterdir()) == []  # --no-agent: no sampling at all
    assert "metrics on" not in stderr.decode()


def test_a_killed_job_loses_no_line_and_exits_137_even_on_a_busy_port(tmp_path: Path) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    out, seen = tmp_path / "run", tmp_path / "env.json"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _start(out, script, str(seen), options=("--listen", f"127.0.0.1:{port}", "--html"))
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 137
    assert json.loads(seen.read_text())["PYTHONUNBUFFERED"] == "1"
    lines = (out / "output.log").read_text().splitlines()
    assert lines == [
        *(f"step {k} loss 2.{k:04d}" for k in range(500)),
        "the last line before the kill",
    ]
    assert f"cannot serve metrics on 127.0.0.1:{port}" in stderr.decode()
    assert "the job exited with 137 (signal SIGKILL)" in stderr.decode()
    summary = stdout.decode().split("the last line before the kill\n", 1)[1]
    assert "No NCCL lines at all" in summary  # analyze's report of DIR
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_a_command_that_is_not_there_is_127_and_a_used_folder_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "ncclscope", "run", "--out", str(out), "--listen", "none",
           "--no-summary", "--", "no-such-command-ncclscope"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 127
    assert "cannot run no-such-command-ncclscope" in done.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    assert again.returncode == 2
    assert "is not empty" in again.stderr


def test_a_reader_that_goes_away_loses_the_log_no_line_nor_the_status(tmp_path: Path) -> None:
    job = "import sys\nfor k in range(100_000): print('line', k)\nsys.exit(4)"
    cmd = [sys.executable, "-m", "ncclscope", "run", "--out", str(tmp_path / "run"),
           "--no-agent", "--", sys.executable, "-c", job]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()  # as `| head -1` does
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 4
    assert "the job exited with 4" in stderr.decode()
    log = (tmp_path / "run" / "output.log").read_text().splitlines()
    assert log == [f"line {k}" for k in range(100_000)]


# -- the pieces, in-process ---------------------------------------------------------------


def _tee(
    chunks: list[tuple[int, bytes]], *, terminal_closed: bool = False
) -> tuple[bytes, bytes, Tee]:
    """Feed ``chunks`` (stream 0 or 1, bytes) through a Tee over real pipes."""
    job = [os.pipe(), os.pipe()]
    term = [os.pipe(), os.pipe()]
    if terminal_closed:
        os.close(term[0][0])
    buf = io.BytesIO()
    tee = Tee([job[0][0], job[1][0]], [term[0][1], term[1][1]], buf,
              clock=lambda: datetime(2026, 1, 2, 3, 4, 5, 6))  # fmt: skip
    for stream, data in chunks:
        os.write(job[stream][1], data)
    for _, w in job:
        os.close(w)
    tee.run()
    for _, w in term:
        os.close(w)
    seen = os.read(term[0][0], 1 << 20) if not terminal_closed else b""
    for r, _ in job:
        os.close(r)
    return seen, buf.getvalue(), tee


def test_the_tee_stamps_nccl_lines_only_and_keeps_their_own_times() -> None:
    own = b"[2026-01-01 00:00:00.000001] h:1:1 [0] NCCL INFO own time\n"
    terminal, log, tee = _tee([
        (0, b"[rank3]:h:41:41 [3] NCCL INFO AllReduce: opCount 1\nplain "),
        (1, b"an error\n"),
        (0, b"line\n" + own + b"no newline at the end"),
    ])  # fmt: skip
    assert terminal == (
        b"[rank3]:h:41:41 [3] NCCL INFO AllReduce: opCount 1\nplain line\n" + own
        + b"no newline at the end"
    )  # fmt: skip
    lines = log.splitlines()  # both pipes were ready at once: either may come first
    assert [x for x in lines if x != b"an error"] == [
        b"[rank3]:[2026-01-02 03:04:05.000006] h:41:41 [3] NCCL INFO AllReduce: opCount 1",
        b"plain line",
        own.rstrip(b"\n"),
        b"no newline at the end",
    ]
    assert lines.count(b"an error") == 1
    assert (tee.stats.lines, tee.stats.stamped) == (5, 1)


def test_the_tee_keeps_logging_when_the_terminal_is_gone() -> None:
    _, log, tee = _tee([(0, b"a\nb\n")], terminal_closed=True)
    assert log == b"a\nb\n"
    assert tee.stats.terminal_lost == 4


def test_a_user_setting_under_any_of_its_names_is_kept() -> None:
    env = job_environment({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/t_"}, Path("/r"))
    assert env.env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/x/t_"
    assert "TORCH_FR_DUMP_TEMP_FILE" not in env.env
    assert env.env["TORCH_FR_BUFFER_SIZE"] == env.env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env.env["NCCL_DEBUG_FILE"] == "/r/nccl/%h.%p.log"


@pytest.mark.parametrize(
    "how", ["exit 0", "exit 3", "kill -INT $$", "kill -KILL $$", "kill -TERM $$"]
)
def test_exit_status_is_what_a_shell_reports(how: str) -> None:
    job = subprocess.run(["sh", "-c", how], check=False)
    shell = subprocess.run(["sh", "-c", f"sh -c '{how}'; echo $?"], capture_output=True,
                           text=True, check=False)  # fmt: skip
    assert exit_status(job.returncode) == int(shell.stdout)


def test_docs_run_md_shows_the_settings_table() -> None:
    doc = (ROOT / "docs" / "run.md").read_text()
    if os.environ.get("NCCLSCOPE_REGENERATE"):
        start = doc.index("| Variable |")
        end = doc.index("\n\n", start)
        doc = doc[:start] + settings_markdown().rstrip("\n") + doc[end:]
        (ROOT / "docs" / "run.md").write_text(doc)
    assert settings_markdown() in doc + "\n" or settings_markdown().rstrip("\n") + "\n" in doc


def test_the_tee_stamps_exactly_as_the_agent_window_does() -> None:
    from ncclscope.agent.live import stamp

    at = datetime(2026, 1, 2, 3, 4, 5, 6)
    lines = [
        "[rank3]:node-0:4103:4103 [3] NCCL INFO AllReduce: opCount 4 comm 0x1",
        "né-0: [1,3]<stdout>:node-0:4103:4110 [3] transport/net_ib.cc:90 NCCL WARN bad",
        "node-0:4103:4103 [3] NCCL INFO NCCL version 2.21.5+cuda12.4",
        "a line that mentions NCCL INFO but has no header",
    ]
    job = os.pipe()
    term = os.pipe()
    buf = io.BytesIO()
    tee = Tee([job[0]], [term[1]], buf, clock=lambda: at, batch_s=0)
    os.write(job[1], "".join(x + "\n" for x in lines).encode())
    os.close(job[1])
    tee.run()
    for fd in (job[0], *term):
        os.close(fd)
    expected = [stamp(x, at) or x for x in lines]
    assert buf.getvalue().decode().splitlines() == expected
    assert tee.stats.stamped == 3
