"""PyTorch Flight Recorder dumps: read safely, per version, into tidy rows.

A dump is what ``ProcessGroupNCCL`` writes per rank on a timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, file ``${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}<rank>``):
a pickle by default, JSON where asked.  Its shape (``FlightRecorder.hpp``, version
``2.x``; a real sample, trimmed)::

    {"version": "2.10", "comm_lib_version": "2.27.5",
     "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
     "pg_status": {"0": {"last_enqueued_collective": 3, "last_started_collective": -1,
                         "last_completed_collective": 2}},
     "entries": [{"record_id": 2, "pg_id": 0, "process_group": ("0", "default_pg"),
                  "collective_seq_id": 3, "p2p_seq_id": 0, "op_id": 3,
                  "profiling_name": "nccl:all_reduce", "time_created_ns": 1764124401...,
                  "input_sizes": [[1024]], "input_dtypes": ["Float"],
                  "output_sizes": [[1024]], "output_dtypes": ["Float"],
                  "state": "scheduled", "time_discovered_started_ns": None,
                  "time_discovered_completed_ns": None, "retired": False,
                  "timeout_ms": 600000, "is_p2p": False,
                  "frames": [{"name": "all_reduce", "filename": ".../distributed_c10d.py",
                              "line": 2950}, ...]}]}

Version ``1.x`` (PyTorch 2.2-2.3) names the sequence ``seq_id`` and has no process
group tuple; JSON dumps write 0 for a time not seen and strings in ``pg_status``.  An
unknown version is read by the keys that are there.

Safety: a pickle can name any Python callable and have the reader call it.  Dumps hold
only dicts, lists, tuples, strings, numbers, booleans and None, so the unpickler here
refuses every global (and persistent id) before anything is called: a hostile file is
reported as refused, and nothing in it runs.
"""

from __future__ import annotations

import gc
import io
import json
import pickle
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ncclscope.parsers.torch.flight_entries import (
    ENTRY_SCHEMA,
    finish_entries,
    normalise_op,
    read_entries,
)
from ncclscope.schema import (
    FLIGHT_DUMPS_SCHEMA,
    FLIGHT_GROUPS_SCHEMA,
    FLIGHT_PG_STATUS_SCHEMA,
    FLIGHT_SCHEMA,
    validate,
)

__all__ = [
    "DUMP_FORMATS",
    "DumpRead",
    "DumpRefusedError",
    "dump_frames",
    "load_dump",
    "normalise_op",
    "read_dump",
    "read_top",
    "sniff_dump",
]

#: Input kinds for the two dump formats (``sources.Input.kind``).
DUMP_FORMATS = {"flight_pickle": "pickle", "flight_json": "json"}

#: How much of a file ``sniff_dump`` looks at.
SNIFF_BYTES = 8192


def _has_keys(head: bytes, quote: bytes) -> bool:
    """``pg_config``, or ``entries`` with an entry's ``profiling_name``, in ``head``."""
    return quote + b"pg_config" + quote in head or (
        quote + b"entries" + quote in head and quote + b"profiling_name" + quote in head
    )


def sniff_dump(head: bytes) -> str | None:
    """The input kind of a file whose first bytes are ``head``: ``flight_pickle``,
    ``flight_json``, or None for anything else.  By content, never by name.

    A pickle is ``\\x80`` + protocol (2-5), an optional frame, then an empty dict that
    the top-level keys fill (``\\x80\\x02}q\\x00(X\\x07\\x00\\x00\\x00version...``); a JSON
    dump is an object.  Either must name ``pg_config``, or ``entries`` and an entry's
    ``profiling_name``, in its head: a checkpoint that happens to be a pickled dict, or a
    JSON-lines log with an ``entries`` key, is not taken for a dump.
    """
    if len(head) >= 3 and head[0] == 0x80 and 2 <= head[1] <= 5:
        k = 2
        if head[k] == 0x95:  # FRAME + 8-byte length (protocol 4+)
            k += 9
        if k < len(head) and head[k] == ord("}") and _has_keys(head, b""):
            return "flight_pickle"
        return None
    text = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    if text[:1] == b"{" and _has_keys(text, b'"'):
        return "flight_json"
    return None


class DumpRefusedError(Exception):
    """A dump that cannot be read safely or at all; ``str()`` says why, for the user."""


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain data: every global and persistent id is
    refused before it is looked up, so no callable from the file is ever called."""

    def find_class(self, module: str, name: str) -> Any:
        raise DumpRefusedError(
            f"pickle refers to {module}.{name}: refused, dumps hold only plain data"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise DumpRefusedError("pickle uses a persistent id: refused, dumps hold only plain data")


#: What the unpickler raises on damaged data (a bad opcode, a wrong stack, a bad length).
_DAMAGED = (
    pickle.UnpicklingError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    OverflowError,
    MemoryError,
)


def load_dump(data: bytes, fmt: str) -> Any:
    """The dump's top-level value, read without running anything.

    Raises:
        DumpRefusedError: a global in a pickle, a truncated or damaged file, invalid
            JSON; the message says which.
    """
    if fmt == "json":
        try:
            return json.loads(data.decode("utf-8", errors="strict"))
        except UnicodeDecodeError as err:
            raise DumpRefusedError(f"JSON dump is not UTF-8 (byte {err.start})") from None
        except json.JSONDecodeError as err:
            raise DumpRefusedError(
                f"invalid JSON at line {err.lineno} column {err.colno} ({err.msg}): "
                "nothing read (was the file cut?)"
            ) from None
        except RecursionError:
            raise DumpRefusedError("JSON nested too deeply: nothing read") from None
    # The cyclic GC scans every new container: with it off a 2,000-entry dump loads
    # 5x faster (PyTorch's own loader does the same).  A buffered reader lets the
    # unpickler take bytes in blocks rather than one read() call per opcode.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _PlainUnpickler(io.BufferedReader(io.BytesIO(data))).load()
    except DumpRefusedError:
        raise
    except EOFError:
        raise DumpRefusedError("pickle data ends early (was the file cut?): nothing read") from None
    except RecursionError:
        raise DumpRefusedError("pickle nested too deeply: nothing read") from None
    except _DAMAGED as err:
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DumpRefusedError(f"damaged pickle ({detail}): nothing read") from None
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class DumpRead:
    """What one dump file held, ready for ``dump_frames``."""

    path: str
    size_bytes: int
    format: str
    version: str | None = None
    layout: str = "unknown"
    rank: int | None = None
    rank_source: str = "none"
    comm_lib_version: str | None = None
    n_entries: int = 0
    #: the entries read (``flight_entries.ENTRY_SCHEMA``: times as ns integers)
    rows: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=ENTRY_SCHEMA))
    #: (pg_name, pg_desc, ranks)
    groups: list[tuple[str, str | None, list[int]]] = field(default_factory=list)
    #: (pg_id, last_enqueued, last_started, last_completed)
    status: list[tuple[int, int | None, int | None, int | None]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    problem: str | None = None


def read_dump(path: Path, display: str, kind: str) -> DumpRead:
    """Read the dump at ``path`` (``kind``: ``flight_pickle`` or ``flight_json``).

    Never raises on bad content: a refused or unreadable file comes back with
    ``problem`` set, a bad entry is counted in ``skipped`` by reason.
    """
    fmt = DUMP_FORMATS[kind]
    try:
        data = path.read_bytes()
    except OSError as err:
        return DumpRead(display, 0, fmt, problem=f"cannot read: {err.strerror or err}")
    out = DumpRead(display, len(data), fmt)
    try:
        top = load_dump(data, fmt)
    except DumpRefusedError as err:
        out.problem = str(err)
        return out
    if not isinstance(top, dict):
        out.problem = f"not a Flight Recorder dump: the top level is a {type(top).__name__}"
        return out
    read_top(top, out)
    _rank(out)
    return out


def read_top(top: dict[Any, Any], out: DumpRead) -> None:
    """Fill ``out`` from a dump's top-level dict (its version, groups, status, entries)."""
    version = top.get("version")
    out.version = None if version is None else str(version)
    major = out.version.split(".", 1)[0] if out.version else ""
    out.layout = {"1": "1.x", "2": "2.x"}.get(major, "unknown")
    if out.layout == "unknown":
        out.notes.append(
            f"Flight Recorder version {out.version or 'missing'} is not one ncclscope "
            "knows (1.x, 2.x): read the keys that are there"
        )
    lib = top.get("comm_lib_version", top.get("nccl_version"))
    out.comm_lib_version = lib if isinstance(lib, str) and lib else None
    out.groups = _groups(top.get("pg_config"), out)
    out.status = _status(top.get("pg_status"), out)
    entries = top.get("entries", [])
    if not isinstance(entries, list):
        out.notes.append(f"entries is a {type(entries).__name__}, not a list: none read")
        entries = []
    out.n_entries = len(entries)
    out.rows, out.skipped = read_entries(entries)
    _name_default_group(out)


def _name_default_group(out: DumpRead) -> None:
    """PyTorch 2.14 (gloo) records the default group's ranks before the group has its
    name: pg_config holds ``{"": {"name": "", "desc": "", ...}}`` while the entries say
    ``("0", "default_pg")``.  Give the nameless group the one name the entries use that
    pg_config lacks."""
    names = {g[0] for g in out.groups}
    if "" not in names:
        return
    used = out.rows.select("pg_name", "pg_desc").drop_nulls("pg_name").unique("pg_name")
    descs = dict(zip(used["pg_name"].to_list(), used["pg_desc"].to_list(), strict=True))
    unknown = set(descs) - names
    target = next(iter(unknown)) if len(unknown) == 1 else "0" if "0" in unknown else None
    if target is None:
        return
    desc = descs[target]
    out.groups = [(target, g[1] or desc, g[2]) if g[0] == "" else g for g in out.groups]


def _ranks_of(value: Any) -> list[int] | None:
    """``"[0, 1, 2]"`` (as PyTorch writes it) or ``[0, 1, 2]`` -> ``[0, 1, 2]``."""
    if isinstance(value, str):
        body = value.strip()
        if not (body.startswith("[") and body.endswith("]")):
            return None
        parts = [p.strip() for p in body[1:-1].split(",") if p.strip()]
        if not all(p.isascii() and p.isdigit() and len(p) <= 10 for p in parts):
            return None
        ranks = [int(p) for p in parts]
    elif isinstance(value, list | tuple) and all(_is_int(v) and v >= 0 for v in value):
        ranks = [int(v) for v in value]
    else:
        return None
    # a rank past int32 is damage, not a rank (the tables hold ranks as Int32)
    return ranks if all(r <= _I32_MAX for r in ranks) else None


def _groups(config: Any, out: DumpRead) -> list[tuple[str, str | None, list[int]]]:
    if config is None:
        return []
    if not isinstance(config, dict):
        out.notes.append(f"pg_config is a {type(config).__name__}, not a dict: groups not read")
        return []
    groups = []
    bad = 0
    for key, info in config.items():
        if isinstance(info, dict):
            name, desc, ranks = info.get("name", key), info.get("desc"), info.get("ranks")
        else:
            name, desc, ranks = key, None, info
        members = _ranks_of(ranks)
        if not isinstance(name, str | int) or members is None:
            bad += 1
            continue
        groups.append((str(name), desc if isinstance(desc, str) else None, members))
    if bad:
        out.notes.append(f"{bad} process group(s) of pg_config without a readable rank list")
    return groups


_I32_MAX = 2**31 - 1
_I64_MAX = 2**63 - 1


def _int_or_none(value: Any) -> int | None:
    """An int (or an int's text) that fits in int64, else None."""
    if _is_int(value):
        number = int(value)
    elif isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,19}", value.strip()):
        number = int(value)
    else:
        return None
    return number if -_I64_MAX <= number <= _I64_MAX else None


def _status(status: Any, out: DumpRead) -> list[tuple[int, int | None, int | None, int | None]]:
    if status is None:
        return []
    if not isinstance(status, dict):
        out.notes.append(f"pg_status is a {type(status).__name__}, not a dict: not read")
        return []
    rows: list[tuple[int, int | None, int | None, int | None]] = []
    bad = 0
    for key, info in status.items():
        pg_id = _int_or_none(key)
        if pg_id is None or not isinstance(info, dict):
            bad += 1
            continue
        row: list[int | None] = []
        for field_name in _STATUS_FIELDS:
            value = info.get(field_name)
            number = _int_or_none(value)
            if number is None and value is not None:
                bad += 1  # ill-typed, or past int64: left unknown
            row.append(number)
        rows.append((pg_id, row[0], row[1], row[2]))
    if bad:
        out.notes.append(
            f"{bad} pg_status group(s) or value(s) not a number that fits int64: left out"
        )
    return rows


_STATUS_FIELDS = (
    "last_enqueued_collective",
    "last_started_collective",
    "last_completed_collective",
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_TIMES = ("created_ts", "started_ts", "completed_ts")

_RANK_IN_NAME = re.compile(r"(?:rank[_-]?)(\d{1,7})(?!.*rank[_-]?\d)")
_TRAILING_DIGITS = re.compile(r"(\d{1,7})(?:\.[A-Za-z]\w*)*$")


def _rank(out: DumpRead) -> None:
    """The dump's global rank: from its file name (``nccl_trace_rank_3``), else from the
    own side of a send/recv (``nccl:send 1->2`` is written by group rank 1)."""
    name = Path(out.path).name
    m = _RANK_IN_NAME.search(name) or _TRAILING_DIGITS.search(name)
    if m:
        out.rank, out.rank_source = int(m.group(1)), "file_name"
        return
    members = {g[0]: sorted(g[2]) for g in out.groups}
    p2p = out.rows.filter(pl.col("op").is_in(["Send", "Recv"]))
    for pg, name in p2p.select("pg_name", "profiling_name").iter_rows():
        _b, _op, own, _peer = normalise_op(name)
        ranks = members.get(pg, [])
        if own is not None and own < len(ranks):
            out.rank, out.rank_source = ranks[own], "p2p"
            return
    out.notes.append(
        "no rank in the file name (PyTorch writes <prefix><rank>) and no send/recv to "
        "tell it: the entries carry no rank"
    )


def _completed() -> pl.Expr:
    """Completed per the dump: state ``completed``, or (a collective) at or below its
    group's ``last_completed_collective``: gloo leaves ``state`` at ``scheduled`` and
    says completion only there (PyTorch 2.14)."""
    by_status = (
        ~pl.col("is_p2p")
        & pl.col("last_completed").is_not_null()
        & (pl.col("collective_seq_id") <= pl.col("last_completed"))
    )
    return (pl.col("state") == "completed") | by_status.fill_null(False)


def dump_frames(
    reads: Iterable[DumpRead], first_file_id: int
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The dumps as tables: (FLIGHT_DUMPS, FLIGHT, FLIGHT_GROUPS, FLIGHT_PG_STATUS).

    ``first_file_id``: the file_id of the first dump (the dumps follow the logs in
    ``Analysis.paths``).
    """
    dumps = []
    parts: list[pl.DataFrame] = []
    groups = []
    status = []
    for k, d in enumerate(reads):
        fid = first_file_id + k
        dumps.append(
            (fid, d.path, d.size_bytes, d.format, d.version, d.layout, d.rank, d.rank_source,
             d.comm_lib_version, d.n_entries, d.rows.height, sum(d.skipped.values()),
             len(d.groups), d.problem)
        )  # fmt: skip
        if d.rows.height:
            part = d.rows
            parts.append(
                part.with_columns(
                    pl.lit(fid, pl.UInt32).alias("file_id"), pl.lit(d.rank, pl.Int32).alias("rank")
                )
            )
        groups += [(fid, d.rank, n, desc, r, len(r)) for n, desc, r in d.groups]
        ids = d.rows.select("pg_id", "pg_name").drop_nulls("pg_id").unique("pg_id")
        pg_names = dict(zip(ids["pg_id"].to_list(), ids["pg_name"].to_list(), strict=True))
        status += [(fid, d.rank, pg, pg_names.get(pg), *rest) for pg, *rest in d.status]
    status_frame = pl.DataFrame(status, schema=FLIGHT_PG_STATUS_SCHEMA, orient="row")
    entries = (
        finish_entries(pl.concat(parts).lazy())
        .with_columns(
            pl.from_epoch(pl.col(c), time_unit="ns")
            .dt.cast_time_unit("us")
            .dt.replace_time_zone("UTC")
            .alias(c)
            for c in _TIMES
        )
        .join(
            status_frame.lazy().select("file_id", "pg_id", "last_completed"),
            on=["file_id", "pg_id"],
            how="left",
            maintain_order="left",
        )
        .with_columns(_completed().alias("completed"))
        .select(list(FLIGHT_SCHEMA))
        .collect()
        if parts
        else pl.DataFrame(schema=FLIGHT_SCHEMA)
    )
    return (
        validate(
            pl.DataFrame(dumps, schema=FLIGHT_DUMPS_SCHEMA, orient="row"),
            FLIGHT_DUMPS_SCHEMA,
            "flight_dumps",
        ),
        validate(entries, FLIGHT_SCHEMA, "flight"),
        validate(
            pl.DataFrame(groups, schema=FLIGHT_GROUPS_SCHEMA, orient="row"),
            FLIGHT_GROUPS_SCHEMA,
            "flight_groups",
        ),
        validate(status_frame, FLIGHT_PG_STATUS_SCHEMA, "flight_pg_status"),
    )
