"""The evidence folder's manifest: what was asked, what answered, what did not, and why.

Layout of one folder (one node, one stall)::

    evidence/<UTC stamp>-<host>-<comm>-<seq>/
      manifest.json          this module's Manifest
      dumps/rank<R>.pickle   Flight Recorder dumps (or .json), one per rank that answered
      stacks/rank<R>.txt     Python stacks (py-spy dump text, or faulthandler text)
      ras/report.txt         NCCL RAS report (or report.json)
      logs/<name>.tail       the last lines of each followed log
      telemetry.jsonl        the node's samples over the stall

A sample ``manifest.json`` (trimmed)::

    {"schema": "ncclscope.evidence/1", "host": "node-1", "written_utc": "2026-11-28T04:31:07Z",
     "stall": {"comm": "0x7f3a...", "seq": 1234, "op": "AllReduce", "waited_s": 300.2,
               "timeout_s": 600.0, "culprit_ranks": [5]},
     "asks": [{"what": "flight_dump", "target": "rank 5 (pid 4321)", "via": "debug_pipe",
               "outcome": "no_answer", "why": "no dump within 5.0 s", "rank": 5, "pid": 4321},
              {"what": "stack", "target": "rank 5 (pid 4321)", "via": "py-spy",
               "outcome": "answered", "file": "stacks/rank5.txt", "rank": 5, "pid": 4321}]}
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal, get_args

__all__ = [
    "MANIFEST_NAME",
    "OUTCOMES",
    "SCHEMA",
    "WHATS",
    "Ask",
    "Manifest",
    "Outcome",
    "What",
    "read_manifest",
    "sniff_manifest",
    "write_manifest",
]

SCHEMA = "ncclscope.evidence/1"
MANIFEST_NAME = "manifest.json"

What = Literal["flight_dump", "stack", "ras", "log_tail", "telemetry"]
WHATS: tuple[What, ...] = get_args(What)
#: answered: the file is whole; the rest say why there is no (usable) file:
#: no_answer (nothing within the time), late (an answer after the time, kept but marked),
#: truncated / garbage (an answer that could not be read whole), refused (the peer or the
#: kernel said no: ptrace denied, permission), unavailable (no way to ask: no socket, no
#: pipe, no py-spy, RAS not listening), skipped (asked already for this stall, or not
#: needed), error (anything else, with its message)
Outcome = Literal[
    "answered",
    "no_answer",
    "late",
    "truncated",
    "garbage",
    "refused",
    "unavailable",
    "skipped",
    "error",
]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)


def _inside(file: object) -> str | None:
    """An answer's file, where it names one inside the evidence folder: a relative path
    with no ``..`` (a damaged or hostile manifest must not make the reader open
    ``/etc/shadow`` or ``../../x``)."""
    if not isinstance(file, str) or not file or "\x00" in file:
        return None
    for path in (PurePosixPath(file), PureWindowsPath(file)):
        if path.is_absolute() or path.drive or ".." in path.parts:
            return None
    return file


@dataclass
class Ask:
    """One thing asked of one peer, and what came of it."""

    what: What
    #: whom, in words: ``rank 5 (pid 4321)``, ``RAS 127.0.0.1:28028``, ``node-1.log``
    target: str
    #: how: ``control_plane /handler/dump_nccl_trace_pickle``, ``debug_pipe``, ``py-spy``,
    #: ``faulthandler``, ``ncclras``, ``file``
    via: str
    outcome: Outcome
    #: why there is no usable answer (empty when answered), a sentence for the user
    why: str = ""
    #: the answer's file, relative to the evidence folder
    file: str | None = None
    elapsed_s: float = 0.0
    pid: int | None = None
    rank: int | None = None
    size_bytes: int = 0
    #: the process's state when asked (psutil: running, sleeping, stopped, disk-sleep,
    #: zombie) or ``gone``; None where no process was asked
    state: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Ask:
        what = doc.get("what")
        outcome = doc.get("outcome")
        return cls(
            what=what if what in WHATS else "log_tail",
            target=str(doc.get("target", "")),
            via=str(doc.get("via", "")),
            outcome=outcome if outcome in OUTCOMES else "error",
            why=str(doc.get("why", "")),
            file=_inside(doc.get("file")),
            elapsed_s=float(doc["elapsed_s"]) if _number(doc.get("elapsed_s")) else 0.0,
            pid=doc["pid"] if isinstance(doc.get("pid"), int) else None,
            rank=doc["rank"] if isinstance(doc.get("rank"), int) else None,
            size_bytes=doc["size_bytes"] if isinstance(doc.get("size_bytes"), int) else 0,
            state=doc["state"] if isinstance(doc.get("state"), str) else None,
        )


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v


@dataclass
class Manifest:
    """One node's evidence for one stall."""

    host: str
    written_utc: str
    #: the stall as the agent saw it: comm, seq, op, waited_s, timeout_s, culprit_ranks, ...
    stall: dict[str, Any] = field(default_factory=dict)
    asks: list[Ask] = field(default_factory=list)
    schema: str = SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "host": self.host,
            "written_utc": self.written_utc,
            "stall": self.stall,
            "asks": [a.to_json() for a in self.asks],
        }


def sniff_manifest(head: bytes) -> bool:
    """Is this the start of an evidence manifest?

    >>> sniff_manifest(b'{"schema": "ncclscope.evidence/1", "host": "node-1"}')
    True
    """
    return b'"ncclscope.evidence/1"' in head[:256] and head.lstrip()[:1] == b"{"


def write_manifest(folder: Path, manifest: Manifest) -> Path:
    """Write ``folder/manifest.json`` atomically (a reader never sees half of it)."""
    path = folder / MANIFEST_NAME
    tmp = folder / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(manifest.to_json(), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_manifest(path: Path) -> Manifest:
    """Read a manifest; raises ValueError (with what is wrong) on anything else."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"not a readable manifest: {e}") from None
    except RecursionError:
        raise ValueError("not a readable manifest: JSON nested too deeply") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"not an ncclscope evidence manifest (schema {SCHEMA} expected)")
    asks = doc.get("asks")
    stall = doc.get("stall")
    return Manifest(
        host=str(doc.get("host", "")),
        written_utc=str(doc.get("written_utc", "")),
        stall=stall if isinstance(stall, dict) else {},
        asks=[Ask.from_json(a) for a in asks if isinstance(a, dict)]
        if isinstance(asks, list)
        else [],
    )
