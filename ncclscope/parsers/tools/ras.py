"""NCCL RAS reports: what ``ncclras`` (or ``echo status | nc localhost 28028``) prints.

RAS (2.24+) gathers every process's view of its communicators over its own network.
The text report (``src/ras/client_support.cc``; trimmed, 2.26 layout)::

    NCCL version 2.26.2 compiled with CUDA 12.6
    CUDA runtime version 12060, driver version 12060

    Job summary
    ===========

      Nodes  Processes         GPUs  Processes     GPUs
    (total)   per node  per process    (total)  (total)
          4          8            1         32       32

    Communicators... (0.00s)
    =============

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         1         4         8        32        32   RUNNING  MISMATCH

    Errors
    ======

    DEAD
      1 job process is considered dead (unreachable via the RAS network)
      Process 4321 on node 10.0.0.7 managing GPU 3

    Warnings
    ========

    #0-0 (fa93daea854b060b) MISMATCH
      Communicator ranks have different AllGather operation counts
      30 ranks have launched up to operation 640
      2 ranks have launched up to operation 641
      Rank 12 -- GPU 4 managed by process 323032 on node 10.137.190.124

Per-op counts (``different AllGather operation counts``) are 2.26+; before that one
count per communicator (``different collective operation counts``).  ``-f json``
(2.28.7+) prints ``{"nccl_version", "timestamp", "communicators": [{"hash", "size",
"ranks": [{"rank", "host", "pid", "status": {...}, "collective_counts": {...}}],
"missing_ranks": [{"rank", ..., "status": {"unresponsive", "considered_dead"}}]}]}``;
2.28.9 omits the comma before a missing rank's ``status``, which is repaired here.

Also read: launcher prefixes on every line, several reports polled into one file (the
last is read, with a note), the JSON after ``nc``'s ``OK`` ack, ``Rank N reported
<error> --`` and the ``N ranks have ...``/``N ranks reported ...`` line that says what
the Rank lines under it share, the writer's placeholders for an unknown process (null),
``ncclras``'s own connection failure (an input problem, not a report), 2.24/2.25's
``The missing ranks: 6,9`` under ``#0-0 (hash) INCOMPLETE`` (a missing row per rank;
2.26+ print a ``Rank N -- ...`` line each), the CUDA NCCL was compiled with
(:attr:`RasRead.cuda_version`).  A count or id that is NaN, a fraction or past int32
is counted as ``number its column cannot hold`` (JSON: the entry not understood),
never raised.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import polars as pl

from ncclscope.parsers.common import fit_rows
from ncclscope.parsers.tools.prefix import strip_prefix
from ncclscope.schema import RAS_COMMS_SCHEMA, RAS_RANKS_SCHEMA, RAS_REPORTS_SCHEMA, validate

__all__ = ["RasRead", "parse_ras_json", "parse_ras_text"]

_VERSION = re.compile(r"^NCCL version (\S+) compiled with CUDA(?: (\d+\.\d+))?")
_CUDA = re.compile(r"CUDA runtime version (-?\d+), driver version (-?\d+)")
_NUMS = re.compile(r"^\s*\d+(?:\s+\d+){2,4}\s*$")
_GROUP = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+(?:-\d+)?)\s+(\d+)\s+(\d+)\s+([A-Z]+)\s+([A-Z,]+)\s*$"
)
_COMM_HEAD = re.compile(r"^#(\d+)-(\d+) \(([0-9a-fA-F]+)\) ([A-Z]+)\s*$")
_PROCESS = re.compile(r"^\s*Process (\d+) on node (\S*) managing GPUs?(?: (.*?))?\s*$")
_RANK = re.compile(
    r"^\s*Rank (\d+)(?: (has launched up to operation \d+|has not launched any operations"
    r"|has status [A-Z]+|reported .+?))? -- (?:GPU (.+?) managed by process (\d+) on node ?(\S*)"
    r"|\[process information not found\])\s*$"
)
#: "30 ranks have launched up to operation 640": what the Rank lines under it share.
_GROUP_OF_RANKS = re.compile(
    r"^(\d+) ranks (have launched up to operation \d+|have not launched any operations"
    r"|have status [A-Z]+|reported .+)$"
)
#: 2.24/2.25 under ``#0-0 (hash) INCOMPLETE``: ``The missing ranks: 6,9`` (2.26+ print a
#: ``Rank N -- ...`` line each instead).
_MISSING_RANKS = re.compile(r"^The missing ranks?:\s*(\d+(?:\s*,\s*\d+)*)\s*,?$")
_MISSING_PROCS = re.compile(r"Missing communicator data from (\d+) job process")
_DEAD_PROCS = re.compile(r"(\d+) job process(?:es)? (?:are|is) considered dead")
_TIMEOUTS = re.compile(r"Encountered (\d+) communication timeout")
_DIFFERENT = re.compile(r"Communicator ranks have different (\w+) operation counts")
_CONNECT_FAILED = re.compile(
    r"Failed to connect to the NCCL RAS service|^Connecting to \S+: |^Resolving \S+: "
    r"|NCCL unexpectedly closed the connection|^Unexpected response from NCCL"
)
_KNOWN_PROSE = (
    "Communicator ranks", "Missing communicator", "Initialization error", "Asynchronous error",
    "[could not", "The outlier", "Node ", "Please make sure", "Will try to continue",
)  # fmt: skip
_INT32 = 2**31
#: A count or id past its column (int32) or written as NaN or a fraction.
_DAMAGED = "number its column cannot hold"
_STATUS_ORDER = ("NOCOMM", "INIT", "RUNNING", "FINALIZE", "ABORT")
_IN_PROGRESS = 7  # ncclInProgress: not an error


@dataclass
class RasRead:
    """One RAS report as read (``file_id`` 0 until the caller sets it)."""

    path: str
    report: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=RAS_REPORTS_SCHEMA))
    comms: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=RAS_COMMS_SCHEMA))
    ranks: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=RAS_RANKS_SCHEMA))
    skipped: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    problem: str | None = None
    #: ``compiled with CUDA 12.6`` of the text header (the JSON does not say it).
    cuda_version: str | None = None


def _int(value: Any) -> int | None:
    """An int32 of the JSON, else None (a float, NaN, ``true``, or past the column)."""
    if isinstance(value, int) and not isinstance(value, bool) and -_INT32 <= value < _INT32:
        return value
    return None


def _fits(*values: int) -> bool:
    """Whether every value fits the report's int32 columns."""
    return all(-_INT32 <= v < _INT32 for v in values)


def _hash(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    h = value.strip().lower().removeprefix("0x").lstrip("0")
    return h or "0"


def _lines(text: str) -> list[str]:
    """The lines of ``text`` without launcher prefixes, from the last report's ``NCCL
    version`` line on (a file of polled reports holds several; the last is the state at
    the end)."""
    lines = [strip_prefix(raw.strip("\ufeff\x00")).rstrip() for raw in text.splitlines()]
    starts = [k for k, line in enumerate(lines) if _VERSION.match(line.strip())]
    return lines[starts[-1] :] if starts else lines


def parse_ras_text(text: str, display: str) -> RasRead:
    """Read a text report (the last one where a file holds several); never raises on its
    content."""
    out = RasRead(display)
    head: dict[str, Any] = {"missing": 0, "dead": 0, "timeouts": 0}
    comms: list[tuple[Any, ...]] = []
    ranks: list[tuple[Any, ...]] = []
    section = ""
    comm: str | None = None
    comm_state = ""
    op: str | None = None
    shared: str | None = None  # what the Rank lines under "N ranks have ..." share
    summary_next = False
    failed: str | None = None
    n_reports = sum(
        1 for raw in text.splitlines() if _VERSION.match(strip_prefix(raw.strip()).strip())
    )
    if n_reports > 1:
        out.notes.append(f"{n_reports} reports in this file; the last one is read")
    for line in _lines(text):
        stripped = line.strip()
        if not stripped or set(stripped) == {"="}:
            continue
        if _CONNECT_FAILED.search(stripped):
            failed = failed or stripped
            continue
        if (m := _VERSION.match(stripped)) and "nccl_version" not in head:
            head["nccl_version"], out.cuda_version = m.group(1), m.group(2)
            continue
        if m := _CUDA.match(stripped):
            runtime, driver = int(m.group(1)), int(m.group(2))
            if _fits(runtime, driver):
                head["cuda_runtime"], head["cuda_driver"] = runtime, driver
            else:
                out.skipped[_DAMAGED] += 1
            continue
        if stripped in ("Job summary", "Errors", "Warnings") or stripped.startswith(
            "Communicators..."
        ):
            section, comm, shared = stripped.split(".")[0], None, None
            continue
        if section == "Job summary":
            if stripped.startswith("(total)"):
                summary_next = True
                continue
            if summary_next and _NUMS.match(stripped):
                nums = [int(x) for x in stripped.split()]
                if not _fits(*nums):
                    out.skipped[_DAMAGED] += 1
                elif len(nums) == 5:
                    head["nodes"], head["processes"], head["gpus"] = nums[0], nums[3], nums[4]
                elif len(nums) == 3:
                    head["nodes"], head["processes"], head["gpus"] = nums
                summary_next = False
            elif summary_next:
                out.skipped["job summary row not understood"] += 1
                summary_next = False
            continue
        if section == "Communicators":
            if (m := _GROUP.match(line)) and not _fits(
                *(int(x) for x in m.groups()[:6] if x.isdigit())
            ):
                out.skipped[_DAMAGED] += 1
            elif m:
                g = m.groups()
                comms.append(
                    (0, int(g[0]), None, int(g[1]), int(g[4]), int(g[2]), g[6], g[7], None)
                )
            elif not stripped.startswith(("Group", "#", "No communicator")):
                out.skipped["communicator table row not understood"] += 1
            continue
        if m := _COMM_HEAD.match(stripped):
            comm, comm_state, op, shared = _hash(m.group(3)), m.group(4), None, None
            continue
        if (m := _MISSING_PROCS.search(stripped)) and not _fits(int(m.group(1))):
            out.skipped[_DAMAGED] += 1
            continue
        if m:
            head["missing"] = int(m.group(1))
            comm_state, comm, shared = "missing", None, None
            continue
        if (m := _DEAD_PROCS.search(stripped)) and not _fits(int(m.group(1))):
            out.skipped[_DAMAGED] += 1
            continue
        if m:
            head["dead"] = int(m.group(1))
            comm_state, comm, shared = "dead", None, None
            continue
        if m := _TIMEOUTS.search(stripped):
            if _fits(int(m.group(1))):
                head["timeouts"] = int(m.group(1))
            else:
                out.skipped[_DAMAGED] += 1
            continue
        if m := _MISSING_RANKS.match(stripped):
            listed = [int(x) for x in m.group(1).split(",")]
            if not _fits(*listed):
                out.skipped[_DAMAGED] += 1
                continue
            state = _rank_state(comm_state, None, op)
            ranks.extend((0, comm, rank, None, None, None, *state) for rank in listed)
            continue
        if stripped in ("INCOMPLETE", "DEAD", "TIMEOUT"):
            continue
        if m := _DIFFERENT.search(stripped):
            # 2.24/2.25 count every collective together ("different collective operation
            # counts"); 2.26+ name the op.
            op, shared = (None if m.group(1) == "collective" else m.group(1)), None
            continue
        if stripped.startswith(("Communicator ranks have different status",
                                "Initialization error", "Asynchronous error")):  # fmt: skip
            op, shared = None, None
            continue
        if m := _GROUP_OF_RANKS.match(stripped):
            shared = m.group(2).replace("have ", "has ", 1)
            continue
        if m := _PROCESS.match(line):
            if int(m.group(1)) >= _INT32:
                out.skipped["process id out of range"] += 1
                continue
            ranks.append((0, None, None, int(m.group(1)), m.group(2) or None, m.group(3) or None,
                          comm_state, None))  # fmt: skip
            continue
        if m := _RANK.match(line):
            rank, pid = int(m.group(1)), int(m.group(4)) if m.group(4) else None
            if rank >= _INT32 or (pid is not None and pid >= _INT32):
                out.skipped["rank or process id out of range"] += 1
                continue
            ranks.append((0, comm, rank, pid, m.group(5) or None, m.group(3),
                          *_rank_state(comm_state, m.group(2) or shared, op)))  # fmt: skip
            continue
        if section in ("Errors", "Warnings") and not stripped.startswith(_KNOWN_PROSE):
            # The report's own lines under a heading are indented; an unindented one
            # is another program's output printed after it (a torch warning...).
            reason = "report line not understood" if line[:1].isspace() else "line not from ncclras"
            out.skipped[reason] += 1
    if "nccl_version" not in head and not comms:
        out.problem = (
            f"ncclras could not reach the job: {failed}"
            if failed
            else "no NCCL version line and no communicator table: not a RAS report"
        )
        return out
    _finish(out, "text", head, None, comms, ranks)
    return out


def _rank_state(comm_state: str, what: str | None, op: str | None) -> tuple[str, str | None]:
    """A named rank's state and detail, from its section and what its line (or the
    "N ranks ..." line above it) says."""
    state = {"INCOMPLETE": "missing", "MISMATCH": "mismatch", "ERROR": "error"}.get(
        comm_state, comm_state.lower() or "named"
    )
    if what is None:
        return state, None
    what = what.removeprefix("has ")
    if what.startswith("status"):
        return "status", what
    if what.startswith(("launched", "not launched")) and op:
        return state, f"{what} ({op})"
    return state, what


def _finish(
    out: RasRead,
    fmt: str,
    head: dict[str, Any],
    ts: datetime | None,
    comms: list[tuple[Any, ...]],
    ranks: list[tuple[Any, ...]],
) -> None:
    n_comms = sum(c[3] or 0 for c in comms)
    report = [(0, fmt, head.get("nccl_version"), head.get("cuda_runtime"), head.get("cuda_driver"),
               ts, head.get("nodes"), head.get("processes"), head.get("gpus"), n_comms,
               head.get("missing", 0), head.get("dead", 0), head.get("timeouts", 0))]  # fmt: skip
    # A number past its column (the communicators summed over damaged groups' counts,
    # each of which fits) is left out, not a stop.
    report, bad_report = fit_rows(report, RAS_REPORTS_SCHEMA)
    comms, bad_comms = fit_rows(comms, RAS_COMMS_SCHEMA)
    ranks, bad_ranks = fit_rows(ranks, RAS_RANKS_SCHEMA)
    if bad := bad_report + bad_comms + bad_ranks:
        out.skipped[_DAMAGED] += bad
    out.report = validate(
        pl.DataFrame(report, schema=RAS_REPORTS_SCHEMA, orient="row"),
        RAS_REPORTS_SCHEMA,
        "ras_reports",
    )
    out.comms = validate(
        pl.DataFrame(comms, schema=RAS_COMMS_SCHEMA, orient="row"), RAS_COMMS_SCHEMA, "ras_comms"
    )
    out.ranks = validate(
        pl.DataFrame(ranks, schema=RAS_RANKS_SCHEMA, orient="row"), RAS_RANKS_SCHEMA, "ras_ranks"
    )


_MISSING_COMMA = re.compile(r'([\d"\]}el])(\s*\n\s*")')


def parse_ras_json(text: str, display: str) -> RasRead:
    """Read a ``-f json`` report; never raises on its content."""
    out = RasRead(display)
    docs = _documents(text)
    if not docs:
        docs = _documents(_MISSING_COMMA.sub(r"\1,\2", text))
        if docs:
            out.notes.append("a missing comma was put back (NCCL 2.28.9's writer drops one)")
    if not docs:
        try:
            json.loads(text)
        except ValueError as err:
            out.problem = f"not valid JSON ({err})"
            return out
        except RecursionError:
            out.problem = "not valid JSON (nested too deeply)"
            return out
    if len(docs) > 1:
        out.notes.append(f"{len(docs)} reports in this file; the last one is read")
    top = docs[-1] if docs else None
    if not isinstance(top, dict):
        out.problem = "not a RAS report: the top level is not an object"
        return out
    version = top.get("nccl_version")
    head: dict[str, Any] = {
        "nccl_version": version if isinstance(version, str) else None,
        "cuda_runtime": _int(top.get("cuda_runtime_version")),
        "cuda_driver": _int(top.get("cuda_driver_version")),
        "missing": 0,
        "dead": 0,
        "timeouts": _int(_dict(top.get("ras")).get("timeouts_count")) or 0,
    }  # fmt: skip
    ts = None
    if isinstance(top.get("timestamp"), str):
        try:
            ts = datetime.strptime(top["timestamp"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        except ValueError:
            out.skipped["timestamp not understood"] += 1
    comms: list[tuple[Any, ...]] = []
    ranks: list[tuple[Any, ...]] = []
    raw_comms = top.get("communicators")
    if not isinstance(raw_comms, list):
        raw_comms = []
        out.skipped["no communicators list"] += 1
    hosts: set[str] = set()
    pids: set[tuple[str, int]] = set()
    for k, c in enumerate(raw_comms):
        if not isinstance(c, dict) or _hash(c.get("hash")) is None:
            out.skipped["communicator without a hash"] += 1
            continue
        _json_comm(k, c, comms, ranks, out, hosts, pids)
    head["nodes"] = len(hosts) or None
    head["processes"] = len(pids) or None
    head["missing"] = sum(1 for r in ranks if r[6] in ("unresponsive", "missing"))
    head["dead"] = sum(1 for r in ranks if r[6] == "dead")
    _finish(out, "json", head, ts, comms, ranks)
    return out


def _documents(text: str) -> list[Any]:
    """The JSON documents in ``text``: one report, several (polled), or one after
    ``ncclras``'s ``OK`` ack or a command line; what is not JSON between them is passed."""
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    pos = 0
    for m in re.finditer(r"(?m)^\s*\{", text):
        if m.start() < pos:
            continue
        try:
            obj, end = decoder.raw_decode(text, m.end() - 1)
        except (ValueError, RecursionError):  # RecursionError: "{{{{..." junk
            continue
        if isinstance(obj, dict) and ("nccl_version" in obj or "communicators" in obj):
            docs.append(obj)  # a report, not an object inside a cut one
            pos = end
    return docs


def _json_comm(
    k: int,
    c: dict[str, Any],
    comms: list[tuple[Any, ...]],
    ranks: list[tuple[Any, ...]],
    out: RasRead,
    hosts: set[str],
    pids: set[tuple[str, int]],
) -> None:
    h = _hash(c.get("hash"))
    members = [
        _peer(r)
        for r in _list(c.get("ranks"))
        if isinstance(r, dict) and _int(r.get("rank")) is not None
    ]
    bad = len(_list(c.get("ranks"))) - len(members)
    if bad:
        out.skipped["rank entry not understood"] += bad
    statuses: set[str] = set()
    errors: set[str] = set()
    counts: dict[str, dict[int, int]] = {}
    for r in members:
        st = _dict(r.get("status"))
        if not st:
            pass  # "status": null (2.29.7 while a communicator initialises): unknown
        elif st.get("abort_flag"):
            statuses.add("ABORT")
        elif st.get("finalize_called") or st.get("destroy_flag"):
            statuses.add("FINALIZE")
        elif st.get("init_state", 0) == 0:
            statuses.add("RUNNING")
        else:
            statuses.add("INIT")
        for key in ("init_state", "async_error"):
            code = _int(st.get(key))
            if code not in (None, 0, _IN_PROGRESS):
                errors.add("ERROR")
                ranks.append((0, h, r["rank"], _int(r.get("pid")), r.get("host"),
                              _gpu(r), "error", f"{key} {code}"))  # fmt: skip
        for op, n in _dict(r.get("collective_counts")).items():
            if _int(n) is not None:
                counts.setdefault(op, {})[r["rank"]] = n
        if isinstance(r.get("host"), str):
            hosts.add(r["host"])
            if _int(r.get("pid")) is not None:
                pids.add((r["host"], r["pid"]))
    details = []
    for op, per_rank in sorted(counts.items()):
        values = Counter(per_rank.values())
        if len(values) < 2:
            continue
        errors.add("MISMATCH")
        usual = values.most_common(1)[0][0]
        details.append(f"{op} " + "/".join(str(v) for v in sorted(values)))
        for rank, n in sorted(per_rank.items()):
            if n != usual:
                r = next(x for x in members if x["rank"] == rank)
                what = f"launched up to operation {n} ({op}; most ranks {usual})"
                ranks.append((0, h, rank, _int(r.get("pid")), r.get("host"), _gpu(r), "mismatch",
                              what))  # fmt: skip
    if len(statuses) > 1:
        errors.add("MISMATCH")
    for m in _list(c.get("missing_ranks")):
        if not isinstance(m, dict) or _int(m.get("rank")) is None:
            out.skipped["missing rank entry not understood"] += 1
            continue
        m = _peer(m)
        st = _dict(m.get("status"))
        state = (
            "dead"
            if st.get("considered_dead")
            else "unresponsive"
            if st.get("unresponsive")
            else "missing"
        )
        errors.add("INCOMPLETE")
        ranks.append((0, h, m["rank"], _int(m.get("pid")), m.get("host"), _gpu(m), state, None))
    status = max(statuses, key=_STATUS_ORDER.index) if statuses else "NOCOMM"
    error = ",".join(e for e in ("INCOMPLETE", "ERROR", "MISMATCH") if e in errors) or "OK"
    node_set = {r.get("host") for r in members if isinstance(r.get("host"), str)}
    comms.append((0, k, h, 1, _int(c.get("size")), len(node_set) or None, status, error,
                  "; ".join(details) or None))  # fmt: skip


def _peer(r: dict[str, Any]) -> dict[str, Any]:
    """A rank entry with the writer's placeholders for an unknown process (``"host":
    "unknown"``, ``"pid": -1``) as None."""
    pid, host = _int(r.get("pid")), r.get("host")
    return {
        **r,
        "pid": pid if pid is not None and pid >= 0 else None,
        "host": host if isinstance(host, str) and host not in ("", "unknown") else None,
    }


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _gpu(r: dict[str, Any]) -> str | None:
    dev = _int(r.get("cuda_dev"))
    return None if dev is None else str(dev)
