#!/usr/bin/env python3
"""Damage the shipped fixtures the ways logs get damaged and run ``analyze`` on each.

Per input, one of two shapes:

* **a log** (70%): one fixture's top-level file, under its own name (or its telemetry
  parts), damaged one to three ways drawn from ``DAMAGES`` (a flipped byte, a number that
  overflows, a line spliced from two, lines dropped / doubled / shuffled, a cut mid-line,
  a truncated gzip, UTF-16, CRLF, launcher prefixes, binary junk, a giant line), or (40%
  of these) one to five of its lines damaged in place; ``analyze FILE``;
* **a folder** (30%): a fixture stored as a folder of files (a Flight Recorder case
  ``fixtures/flight-recorder/<case>/``, an evidence case ``fixtures/evidence-torch/<case>/``
  with its nodes' ``manifest.json``, ``dumps/``, ``stacks/``, or a fixture's top-level
  logs when it has several) copied with its names and layout, one to three of its files
  damaged (text: as a log above, a JSON value of the wrong type or a key dropped, or
  lines in place; binary, a pickle, parquet or gzip: cut, flipped bytes, junk written
  over or into it), sometimes a file removed or emptied; ``analyze FOLDER`` as a user
  would name it.

``ncclscope analyze ... --format json`` runs in a worker process (click's CliRunner,
under a memory limit).  Counted:

* **traceback**: any exception out of the command (``SystemExit`` is an exit status);
* **hang**: no answer within ``--timeout`` s (the worker is killed and restarted);
* **invalid JSON**: stdout is not one JSON document with the ``schema`` key, or holds
  NaN/Infinity;
* **lost**: a single log with k lines damaged in place parsed fewer than the clean log's
  parsed lines less k (an undamaged line no longer parsed); the undamaged lines of those
  inputs and the lost ones are reported as ``undamaged_lines`` / ``undamaged_lost``.

Each failure's input is kept under ``--keep`` (default ``fuzz-failures/``) with the
traceback and the command that replays it: ``ncclscope analyze fuzz-failures/000123/*``.

Usage:
    .venv/bin/python benchmarks/fuzz_inputs.py --seed 1 --count 700
    .venv/bin/python benchmarks/fuzz_inputs.py --seed 28 --count 10000 --workers 1
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SKIP = {"README.md", "expected.json"}

#: Numbers no column holds (and a few that some columns cannot).
HUGE = (
    "99999999999999999999",
    "18446744073709551616",
    "9223372036854775808",
    "4294967296",
    "2147483648",
    "340282366920938463463374607431768211456",
    "9" * 60,
    "-1",
    # legal for their column, absurd as data
    "0",
    "2147483647",
    "9223372036854775807",
    "7fffffffffffffff",
    "1e308",
    # digits int() cannot read, or reads but a regex or polars does not
    "1\u00b2",
    "\uff15",
    "\u0661\u0662",
    "-99999999999999999999",
    "ffffffffffffffffffffffff",
    "0x",
    "1e400",
    "nan",
)
PREFIXES = ("[default{r}]:", "[rank{r}]:", "{r}: ", "node-9: ", "[1,{r}]<stdout>:", "\x1b[32m")
#: Address space of the analysing worker (bytes).
MEMORY_LIMIT = 6 << 30
DIGITS = re.compile(rb"-?[0-9a-fA-F]*[0-9][0-9a-fA-F]*")


@dataclass
class Input:
    """A damaged copy: ``files`` (path relative to the input's folder, bytes) are written,
    ``targets`` (relative paths: a file, or a folder fixture's folder) are analysed."""

    fixture: str
    files: list[tuple[str, bytes]]
    targets: list[str]
    telemetry: list[tuple[str, bytes]]
    damages: list[str]
    #: the fixture log it came from, and how many of its lines were damaged in place
    #: (the others untouched, the line count kept); 0: damaged as a whole
    source: Path | None = None
    in_place: int = 0


@dataclass(frozen=True)
class Fixture:
    """A fixture: ``logs``, each fuzzed alone (with ``telemetry``), or a ``folder`` whose
    ``files`` (every file under it, by relative path) are fuzzed together."""

    name: str
    logs: list[Path]
    telemetry: list[Path]
    folder: Path | None = None
    files: tuple[str, ...] = ()


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def flip_byte(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    k = rng.randrange(len(data))
    return data[:k] + bytes([data[k] ^ (1 << rng.randrange(8))]) + data[k + 1 :]


def overflow(rng: random.Random, data: bytes) -> bytes:
    """A digit run (pid, opCount, channel, peer, nranks, cudaDev, busId, size, timer)
    in one to three lines replaced by a number no column holds."""
    lines = _lines(data)
    for _ in range(rng.randint(1, 3)):
        k = rng.randrange(len(lines))
        runs = list(DIGITS.finditer(lines[k]))
        if not runs:
            continue
        for m in rng.sample(runs, min(len(runs), rng.choice((1, 1, 2, 5)))):
            big = rng.choice(HUGE).encode()
            line = lines[k]
            # the same length may have moved: replace by position in the current text
            at = line.find(m.group(), m.start()) if m.start() < len(line) else -1
            if at < 0:
                continue
            lines[k] = line[:at] + big + line[at + len(m.group()) :]
    return b"\n".join(lines)


def splice(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    if len(lines) < 2:
        return data
    for _ in range(rng.randint(1, 3)):
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        a, b = lines[i], lines[j]
        lines[i] = a[: rng.randint(0, len(a))] + b[rng.randint(0, len(b)) :]
    return b"\n".join(lines)


def drop_lines(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    n = rng.randint(1, max(1, len(lines) // 10))
    for _ in range(n):
        if lines:
            del lines[rng.randrange(len(lines))]
    return b"\n".join(lines)


def double_lines(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    for _ in range(rng.randint(1, max(1, len(lines) // 10))):
        k = rng.randrange(len(lines))
        lines.insert(k, lines[k])
    return b"\n".join(lines)


def shuffle_lines(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    start = rng.randrange(len(lines))
    window = lines[start : start + rng.randint(2, 200)]
    rng.shuffle(window)
    lines[start : start + len(window)] = window
    return b"\n".join(lines)


def cut(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randint(0, len(data))]


def utf16(rng: random.Random, data: bytes) -> bytes:
    text = data.decode("utf-8", "replace")
    return text.encode(rng.choice(("utf-16", "utf-16-le", "utf-16-be")))


def crlf(rng: random.Random, data: bytes) -> bytes:
    del rng
    return data.replace(b"\n", b"\r\n")


def prefixes(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    template = rng.choice(PREFIXES)
    share = rng.choice((1.0, 0.5, 0.05))
    return b"\n".join(
        (template.format(r=rng.randrange(16)).encode() + line if rng.random() < share else line)
        for line in lines
    )


def binary(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    k = rng.randrange(len(lines))
    junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
    lines.insert(k, junk)
    return b"\n".join(lines)


def giant(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    k = rng.randrange(len(lines))
    lines.insert(k, lines[k] * rng.randint(50, 3000))
    return b"\n".join(lines)


#: Damages to a log's bytes, by name; gzip (a truncated one) is applied last.
DAMAGES: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "flip_byte": flip_byte,
    "overflow": overflow,
    "splice": splice,
    "drop": drop_lines,
    "double": double_lines,
    "shuffle": shuffle_lines,
    "cut": cut,
    "utf16": utf16,
    "crlf": crlf,
    "prefixes": prefixes,
    "binary": binary,
    "giant": giant,
}
#: Draw weights: the line-level damages (what a reader must contain per line) most often.
WEIGHTS = {"overflow": 6, "flip_byte": 4, "splice": 4, "binary": 2, "prefixes": 2}


def flip_bytes(rng: random.Random, data: bytes) -> bytes:
    for _ in range(rng.randint(2, 16)):
        data = flip_byte(rng, data)
    return data


def junk(rng: random.Random, data: bytes) -> bytes:
    """Random bytes written over or into a file (a torn write, a reused block)."""
    noise = rng.randbytes(rng.randint(1, 64))
    k = rng.randrange(len(data) + 1)
    if rng.random() < 0.5:
        return data[:k] + noise + data[k + len(noise) :]
    return data[:k] + noise + data[k:]


#: Damages to a binary file's bytes (a pickle, parquet, gzip): it has no lines.
BINARY_DAMAGES: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "cut": cut,
    "flip_byte": flip_byte,
    "flip_bytes": flip_bytes,
    "junk": junk,
}
#: JSON values of another type, or absurd for any field.
ODD_VALUES: tuple[Any, ...] = (
    None, "", "x", "-1", -1, 0, 2**64, -(2**63) - 1, 1e308, 0.5, True, [], {}, [None],
    {"": None}, "9" * 40,
)  # fmt: skip


def json_value(rng: random.Random, data: bytes) -> bytes:
    """One to three values of a JSON document replaced by a value of another type, or
    their keys dropped (a dump of another version, a hand-edited manifest)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return flip_byte(rng, data)
    slots: list[tuple[Any, Any]] = []
    todo = [doc]
    while todo:
        node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            slots.append((node, key))
            if isinstance(value, (dict, list)):
                todo.append(value)
    if not slots:
        return json.dumps(rng.choice(ODD_VALUES)).encode()
    for _ in range(rng.randint(1, 3)):
        node, key = rng.choice(slots)
        if isinstance(node, dict) and rng.random() < 0.25:
            node.pop(key, None)
        else:
            node[key] = rng.choice(ODD_VALUES)
    return json.dumps(doc, indent=1).encode()


def is_binary(data: bytes) -> bool:
    """A pickle, parquet file, gzip or other bytes that are not text."""
    head = data[:4096]
    if head[:1] == b"\x80" or head[:4] == b"PAR1" or head[:2] == b"\x1f\x8b" or b"\0" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        return err.start < len(head) - 4  # not just a character cut at 4096
    return False


#: Files in a folder fixture that a user's folder would not hold (the fixture's truth).
FOLDER_SKIP = SKIP | {"truth.json"}


def _folder_files(folder: Path, *, top_only: bool = False) -> tuple[str, ...]:
    found = folder.iterdir() if top_only else folder.rglob("*")
    return tuple(
        sorted(
            str(p.relative_to(folder))
            for p in found
            if p.is_file() and p.name not in FOLDER_SKIP and not p.name.startswith(".")
        )
    )


def fixtures(root: Path) -> tuple[list[Fixture], list[Fixture]]:
    """The log fixtures (top-level files, telemetry parts) and the folder fixtures: every
    subfolder of a fixture but its telemetry (a Flight Recorder or evidence case), and a
    fixture with several top-level logs as one folder."""
    logs_out: list[Fixture] = []
    folders_out: list[Fixture] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        logs = sorted(p for p in folder.iterdir() if p.is_file() and p.name not in SKIP)
        tel = sorted((folder / "telemetry").glob("part-*.parquet"))
        if logs:
            logs_out.append(Fixture(folder.name, logs, tel))
        if len(logs) > 1:
            files = _folder_files(folder, top_only=True)
            folders_out.append(Fixture(folder.name, [], [], folder, files))
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "telemetry"):
            files = _folder_files(sub)
            if files:
                folders_out.append(Fixture(f"{folder.name}/{sub.name}", [], [], sub, files))
    return logs_out, folders_out


#: Damages of one line that keep it one line (for the in-place inputs).
LINE_DAMAGES = ("overflow", "overflow", "flip_byte", "splice", "binary", "cut", "utf16", "giant")


def _one_line(rng: random.Random, how: str, line: bytes, other: bytes) -> bytes:
    if how == "splice":
        out = line[: rng.randint(0, len(line))] + other[rng.randint(0, len(other)) :]
    elif how == "binary":
        out = bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))
    elif how == "cut":
        out = line[: rng.randint(0, len(line))]
    elif how == "giant":
        out = line * rng.randint(50, 3000)
    else:
        out = DAMAGES[how](rng, line)
    return out.replace(b"\n", b" ").replace(b"\r", b" ")


#: Share of the inputs that are a folder fixture.
FOLDER_SHARE = 0.3


def _damage_text(rng: random.Random, data: bytes, damages: list[str], where: str) -> bytes:
    """A text file damaged as a whole, one to three ways."""
    names = list(DAMAGES)
    weights = [WEIGHTS.get(n, 1) for n in names]
    for how in rng.choices(names, weights, k=rng.randint(1, 3)):
        data = DAMAGES[how](rng, data)
        damages.append(where + how)
    return data


def _damage_lines(
    rng: random.Random, data: bytes, damages: list[str], where: str
) -> tuple[bytes, int]:
    """One to five lines damaged in place, the others untouched; also the count."""
    lines = data.split(b"\n")
    k = rng.randint(1, min(5, max(1, len(lines) - (lines[-1] == b""))))
    for at in rng.sample(range(max(1, len(lines) - (lines[-1] == b""))), k):
        how = rng.choice(LINE_DAMAGES)
        lines[at] = _one_line(rng, how, lines[at], rng.choice(lines))
        damages.append(f"{where}line:{how}")
    return b"\n".join(lines), k


def _damage_file(rng: random.Random, rel: str, data: bytes, damages: list[str]) -> bytes | None:
    """One file of a folder fixture damaged (None: removed)."""
    where = rel + ":"
    r = rng.random()
    if r < 0.04:
        damages.append(where + "missing")
        return None
    if r < 0.08:
        damages.append(where + "empty")
        return b""
    if is_binary(data):
        how = rng.choice(list(BINARY_DAMAGES))
        damages.append(where + how)
        return BINARY_DAMAGES[how](rng, data)
    if rel.endswith(".json") and r < 0.35:
        damages.append(where + "json_value")
        return json_value(rng, data)
    if r < 0.6:
        return _damage_lines(rng, data, damages, where)[0]
    return _damage_text(rng, data, damages, where)


def _folder_input(rng: random.Random, fx: Fixture) -> Input:
    assert fx.folder is not None
    base = fx.folder.name
    files: dict[str, bytes] = {rel: (fx.folder / rel).read_bytes() for rel in fx.files}
    damages: list[str] = []
    for rel in rng.sample(fx.files, min(len(fx.files), rng.choice((1, 1, 1, 2, 3)))):
        data = _damage_file(rng, rel, files[rel], damages)
        if data is None:
            del files[rel]
        else:
            files[rel] = data
    written = [(f"{base}/{rel}", data) for rel, data in sorted(files.items())]
    return Input(fx.name, written, [base], [], damages)


def make_input(rng: random.Random, table: tuple[list[Fixture], list[Fixture]]) -> Input:
    logs, folders = table
    if folders and rng.random() < FOLDER_SHARE:
        return _folder_input(rng, rng.choice(folders))
    fx = rng.choice(logs)
    log = rng.choice(fx.logs)
    data = log.read_bytes()
    damages: list[str] = []
    # the file's own name: a reader may know a dump's rank by it
    file_name = log.name
    if rng.random() < 0.4:
        # k lines damaged in place: every other line must still be parsed
        data, k = _damage_lines(rng, data, damages, "")
        return Input(fx.name, [(file_name, data)], [file_name], [], damages, log, k)
    telemetry: list[tuple[str, bytes]] = []
    if fx.telemetry and rng.random() < 0.15:
        # a telemetry part damaged (a cut, flipped bytes, junk), the log kept
        parts = [(p.name, p.read_bytes()) for p in fx.telemetry]
        k = rng.randrange(len(parts))
        how = rng.choice(list(BINARY_DAMAGES))
        parts[k] = (parts[k][0], BINARY_DAMAGES[how](rng, parts[k][1]))
        telemetry = parts
        damages.append(f"telemetry:{how}")
    data = _damage_text(rng, data, damages, "")
    if rng.random() < 0.05:
        packed = gzip.compress(data, mtime=0)
        data = packed[: rng.randint(10, max(10, len(packed) - 1))]
        file_name += ".gz"
        damages.append("gzip_cut")
    return Input(fx.name, [(file_name, data)], [file_name], telemetry, damages)


def _check(stdout: str) -> str | None:
    """Why stdout is not a valid report, or None."""

    def no_constant(value: str) -> Any:
        raise ValueError(f"{value} in the JSON")

    try:
        doc = json.loads(stdout, parse_constant=no_constant)
    except ValueError as err:
        return f"invalid JSON: {str(err)[:120]}"
    if not isinstance(doc, dict) or "schema" not in doc:
        return "invalid JSON: no schema key"
    return None


def _worker(conn: Any) -> None:
    """Runs ``analyze`` on each folder it is sent; answers (exit code, failure or None)."""
    import resource
    import traceback

    from click.testing import CliRunner

    # A blow-up (a damaged size enumerated rank by rank) is a MemoryError here, counted
    # as a traceback, not the machine's memory.
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    from ncclscope.cli import cli

    runner = CliRunner()
    while True:
        job = conn.recv()
        if job is None:
            return
        folder, targets = Path(job[0]), job[1]
        args = ["analyze", *(str(folder / t) for t in targets), "--format", "json"]
        args += ["--no-progress"]
        if (folder / "telemetry").is_dir():
            args += ["--telemetry", str(folder / "telemetry")]
        result = runner.invoke(cli, args)
        exc = result.exception
        if exc is not None and not isinstance(exc, SystemExit):
            tb = "".join(traceback.format_exception(exc))
            conn.send((result.exit_code, "traceback", f"{type(exc).__name__}: {exc}", tb))
            continue
        why = _check(result.stdout)
        if why:
            conn.send((result.exit_code, "invalid_json", why, ""))
            continue
        inputs = json.loads(result.stdout)["inputs"]
        counts = (inputs[0]["lines"], inputs[0]["parsed"]) if len(inputs) == 1 else None
        conn.send((result.exit_code, None, counts, ""))


class Worker:
    """One analysing child process, restarted after a hang."""

    def __init__(self) -> None:
        self.proc: Any = None
        self.conn: Any = None
        self.start()

    def start(self) -> None:
        ctx = mp.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()

    def run(
        self, folder: Path, targets: list[str], timeout: float
    ) -> tuple[int, str | None, Any, str]:
        self.conn.send((str(folder), targets))
        if self.conn.poll(timeout):
            try:
                answer: tuple[int, str | None, Any, str] = self.conn.recv()
            except EOFError:
                self.start()
                return (-1, "traceback", "worker died", "")
            return answer
        self.proc.kill()
        self.proc.join()
        self.start()
        return (-1, "hang", f"no answer in {timeout:.0f} s", "")

    def stop(self) -> None:
        self.conn.send(None)
        self.proc.join(5)


def _write(inp: Input, folder: Path) -> None:
    folder.mkdir(parents=True)
    for rel, data in inp.files:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    if inp.telemetry:
        tel = folder / "telemetry"
        tel.mkdir()
        for name, data in inp.telemetry:
            (tel / name).write_bytes(data)


def _one_shard(args: tuple[int, int, int, int, float, str, str]) -> dict[str, Any]:
    seed, count, shard, shards, timeout, root, keep = args
    table = fixtures(Path(root))
    worker = Worker()
    failures: list[dict[str, Any]] = []
    kinds: Counter[str] = Counter()
    clean: dict[Path, tuple[int, int] | None] = {}
    undamaged = lost = 0
    with tempfile.TemporaryDirectory(prefix="ncclscope-fuzz-") as tmp:
        for k in range(shard, count, shards):
            rng = random.Random(f"{seed}:{k}")
            inp = make_input(rng, table)
            folder = Path(tmp) / f"{k:06d}"
            _write(inp, folder)
            _code, failure, why, tb = worker.run(folder, inp.targets, timeout)
            if failure is None and inp.source is not None and why is not None:
                if inp.source not in clean:
                    original = Path(tmp) / "clean"
                    files = [(inp.targets[0], inp.source.read_bytes())]
                    _write(Input("", files, inp.targets, [], []), original)
                    answer = worker.run(original, inp.targets, timeout)
                    clean[inp.source] = answer[2] if answer[1] is None else None
                    shutil.rmtree(original)
            # a clean file that is not one scanned log (a tool's report, a dump) has no
            # line count to keep
            counted = clean.get(inp.source) if inp.source is not None else None
            if failure is None and why and counted:
                (lines, parsed), (_, clean_parsed) = why, counted
                undamaged += lines - inp.in_place
                # the damaged lines may each cost their own parse, no other line may
                missing = max(0, clean_parsed - inp.in_place - parsed)
                lost += missing
                if missing:
                    failure, why = "lost", f"{missing} undamaged line(s) no longer parsed"
            if failure is not None:
                kinds[failure] += 1
                kept = Path(keep) / f"{k:06d}"
                shutil.rmtree(kept, ignore_errors=True)
                shutil.copytree(folder, kept)
                replay = " ".join(str(kept / t) for t in inp.targets)
                if inp.telemetry:
                    replay += f" --telemetry {kept / 'telemetry'}"
                (kept.parent / f"{k:06d}.txt").write_text(
                    f"fixture {inp.fixture} damages {inp.damages}\n"
                    f"ncclscope analyze {replay}\n{why}\n{tb}"
                )
                failures.append(
                    {"input": k, "fixture": inp.fixture, "damages": inp.damages, "why": why}
                )
            shutil.rmtree(folder)
    worker.stop()
    return {"failures": failures, "kinds": dict(kinds), "undamaged": undamaged, "lost": lost}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--count", type=int, default=700)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per input")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--fixtures", type=Path, default=REPO / "fixtures")
    parser.add_argument("--keep", type=Path, default=Path("fuzz-failures"))
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    began = time.monotonic()
    jobs = [
        (args.seed, args.count, s, args.workers, args.timeout, str(args.fixtures), str(args.keep))
        for s in range(args.workers)
    ]
    if args.workers == 1:
        shards = [_one_shard(jobs[0])]
    else:
        # not a multiprocessing.Pool: its daemonic processes cannot start the workers
        with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
            shards = list(pool.map(_one_shard, jobs))
    failures = sorted((f for s in shards for f in s["failures"]), key=lambda f: f["input"])
    kinds: Counter[str] = Counter()
    for s in shards:
        kinds.update(s["kinds"])
    classes = Counter(str(f["why"]).split("\n")[0][:100] for f in failures)
    result = {
        "inputs": args.count,
        "seed": args.seed,
        "failures": len(failures),
        "tracebacks": kinds["traceback"],
        "hangs": kinds["hang"],
        "invalid_json": kinds["invalid_json"],
        # inputs with lines damaged in place: the other lines, and how many of them were
        # no longer parsed (the parsed count fell by more than the damaged lines)
        "undamaged_lines": sum(s["undamaged"] for s in shards),
        "undamaged_lost": sum(s["lost"] for s in shards),
        "seconds": round(time.monotonic() - began, 1),
        "classes": dict(classes.most_common()),
        "first": failures[:20],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
