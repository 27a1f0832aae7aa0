"""``analyze --format json``: the stable contract ``ncclscope.analysis/1``.

Every field is documented in ``docs/json-contract.md``; keep both in step.  Lists
have a defined order so that consumers (and tests) can compare them.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import polars as pl

from ncclscope import __version__
from ncclscope.cluster.summary import cluster_doc
from ncclscope.detect.evidence_findings import evidence_summary
from ncclscope.diagnose import Diagnosis
from ncclscope.model import Analysis

__all__ = ["FLIGHT_JOIN_WHY", "SCHEMA", "flight_doc", "to_json_dict"]

SCHEMA = "ncclscope.analysis/1"

_REASONS = ("blank", "other", "malformed", "binary", "too_long")

#: Why a Flight Recorder process group is not joined to the logs (``join`` in the JSON).
FLIGHT_JOIN_WHY = {
    "no_logs": "no COLL lines among the inputs",
    "no_members": "the dumps do not list its ranks (pg_config)",
    "no_communicator": "no communicator of the logs has its ranks",
    "no_entries": "no collective of a known rank in the dumps",
    "no_alignment": "no communicator's calls line up with its calls (op and count)",
}


def to_json_dict(diagnosis: Diagnosis) -> dict[str, Any]:
    """Build the JSON document (plain dicts and lists) for a diagnosis."""
    analysis = diagnosis.analysis
    return {
        "schema": SCHEMA,
        "version": __version__,
        "inputs": _inputs(analysis),
        "problems": [{"path": p.path, "reason": p.reason} for p in analysis.problems],
        "job": _job(analysis),
        "collectives": _collectives(analysis),
        "errors": _errors(analysis),
        "timeouts": _timeouts(analysis),
        "failures": _failures(analysis),
        "timers": _timers(analysis),
        "gaps": [{"what": g.what, "settings": list(g.settings)} for g in analysis.gaps],
        "findings": _findings(diagnosis),
        "attempts": _attempts(diagnosis),
        "flight_recorder": flight_doc(analysis),
        "nccl_tools": _tools(analysis),
        "evidence": evidence_summary(analysis.evidence),
        "cluster": cluster_doc(analysis.cluster),
    }


def _clean(value: Any) -> Any:
    """A float that is not finite is null in JSON; datetimes are ISO strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _records(frame: pl.DataFrame, drop: tuple[str, ...] = ("file_id",)) -> list[dict[str, Any]]:
    cols = [c for c in frame.columns if c not in drop]
    return [{k: _clean(r[k]) for k in cols} for r in frame.iter_rows(named=True)]


def _cuda_text(code: int | None) -> str | None:
    """A CUDA version code as RAS prints it (``cudaRuntimeGetVersion``: major*1000 +
    minor*10) as ``A.B``: ``12060`` -> ``"12.6"``; None for none or a non-positive code."""
    if code is None or code <= 0:
        return None
    return f"{code // 1000}.{code % 1000 // 10}"


def _tools(analysis: Analysis) -> dict[str, Any]:
    """What came from NCCL's own tools among the inputs (not from the logs): Inspector
    records, nccl-tests runs, RAS reports; per file, what was read and skipped."""
    t = analysis.tools
    paths = {fid: path for fid, path, _kind, _n in t.files}
    files = [
        {
            "path": path,
            "kind": kind,
            "records": n,
            "skipped": sum(t.skipped.get(path, {}).values()),
            "skipped_by_reason": t.skipped.get(path, {}),
            "notes": t.notes.get(path, []),
        }
        for _fid, path, kind, n in sorted(t.files, key=lambda f: f[1])
    ]
    ins = t.inspector
    comms = (
        ins.group_by("comm_hash")
        .agg(
            pl.col("comm_name").drop_nulls().first(),
            pl.col("nranks").max(),
            pl.col("comm_rank").n_unique().alias("ranks_with_records"),
            pl.len().alias("records"),
        )
        .sort("comm_hash")
    )
    by_op = (
        ins.group_by("op")
        .agg(
            pl.len().alias("records"),
            pl.col("exec_time_s").median().alias("median_exec_time_s"),
            pl.col("bus_bw_bytes_per_s").median().alias("median_bus_bw_bytes_per_s"),
        )
        .sort("op")
    )
    joined = t.inspector_joined
    runs = []
    for r in t.nccl_tests_runs.sort("file_id", "run").iter_rows(named=True):
        rows = t.nccl_tests.filter(
            (pl.col("file_id") == r["file_id"]) & (pl.col("run") == r["run"])
        )
        runs.append(
            {
                "path": paths.get(r["file_id"]),
                **{k: _clean(v) for k, v in r.items() if k not in ("file_id",)},
                "table": _records(rows.sort("line_no"), ("file_id", "run", "test")),
            }
        )
    reports = []
    for r in t.ras_reports.sort("file_id").iter_rows(named=True):
        fid = r["file_id"]
        reports.append(
            {
                "path": paths.get(fid),
                **{k: _clean(v) for k, v in r.items() if k != "file_id"},
                "cuda_version": t.ras_compiled_cuda.get(fid),
                "cuda_runtime": _cuda_text(r["cuda_runtime_version"]),
                "cuda_driver": _cuda_text(r["cuda_driver_version"]),
                "comms": _records(t.ras_comms.filter(pl.col("file_id") == fid)),
                "ranks": _records(t.ras_ranks.filter(pl.col("file_id") == fid)),
            }
        )
    return {
        "files": files,
        "inspector": {
            "records": ins.height,
            "versions": t.inspector_versions,
            "hosts": sorted(h for h in ins["host"].drop_nulls().unique()),
            "communicators": _records(comms, ()),
            "by_op": _records(by_op, ()),
            "joined": joined.height,
            "joined_size_agrees": int(joined["agree"].sum()),
            "not_joined_why": t.inspector_unjoined,
        },
        "nccl_tests": {"runs": runs},
        "ras": {"reports": reports},
    }


_STATES = ("scheduled", "started", "completed")


def flight_doc(analysis: Analysis) -> dict[str, Any]:
    """What came from PyTorch Flight Recorder dumps (not from the logs): per dump, per
    process group (with the communicator of the logs it joined, or why not)."""
    fl = analysis.flight
    entries = fl.entries
    dumps = [
        {
            "path": r["path"],
            "size_bytes": r["size_bytes"],
            "format": r["format"],
            "version": r["version"],
            "layout": r["layout"],
            "rank": r["rank"],
            "rank_source": r["rank_source"],
            "comm_lib_version": r["comm_lib_version"],
            "entries": r["entries"],
            "read": r["read"],
            "skipped": r["skipped"],
            "skipped_by_reason": fl.skipped.get(r["path"], {}),
            "process_groups": r["groups"],
            "problem": r["problem"],
            "notes": fl.notes.get(r["path"], []),
        }
        for r in fl.dumps.sort("path").iter_rows(named=True)
    ]
    status: dict[str, list[dict[str, Any]]] = {}
    for r in fl.pg_status.sort("rank", "pg_id", nulls_last=True).iter_rows(named=True):
        status.setdefault(r["pg_name"] or str(r["pg_id"]), []).append(
            {k: r[k] for k in ("rank", "last_enqueued", "last_started", "last_completed")}
        )
    groups = [
        {
            "name": r["pg_name"],
            "desc": r["pg_desc"],
            "ranks": r["pg_ranks"] if r["pg_ranks"] is not None else [],
            "ranks_with_entries": r["ranks_with_entries"],
            "entries": int((entries["pg_name"] == r["pg_name"]).sum()),
            "status": status.get(r["pg_name"], []),
            "join": r["reason"],
            "comm_key": r["comm_key"],
            "seq_offset": r["offset"],
            "checked": r["checked"],
            "agreed": r["matched"],
        }
        for r in fl.pg_comms.sort("pg_name").iter_rows(named=True)
    ]
    by_state = entries["state"].value_counts()
    counts = dict(zip(by_state["state"].to_list(), by_state["count"].to_list(), strict=True))
    return {
        "dumps": dumps,
        "ranks": sorted(int(r) for r in fl.dumps["rank"].drop_nulls().unique()),
        "versions": sorted(v for v in fl.dumps["version"].drop_nulls().unique()),
        "entries": entries.height,
        "entries_by_state": {s: int(counts.get(s, 0)) for s in _STATES},
        "completed": int(entries["completed"].sum()),
        "process_groups": groups,
    }


def _attempts(diagnosis: Diagnosis) -> list[dict[str, Any]]:
    """The runs the inputs hold, in order; findings by their index in ``findings``."""
    analysis = diagnosis.analysis
    out = []
    for a in diagnosis.attempts:
        spans = [
            {
                "path": analysis.paths[file_id],
                "first_line": lo,
                "last_line": hi,
            }
            for file_id, (lo, hi) in sorted(a.spans.items())
            if file_id < len(analysis.paths)
        ]
        out.append(
            {
                "index": a.index,
                "started_by": a.reasons,
                "spans": spans,
                "ts_start": a.ts_start.isoformat() if a.ts_start is not None else None,
                "ts_end": a.ts_end.isoformat() if a.ts_end is not None else None,
                "hosts": a.hosts,
                "pids": a.pids,
                "ranks": a.ranks,
                "world_size": a.world_size,
                "findings": a.findings,
            }
        )
    return out


def _inputs(analysis: Analysis) -> list[dict[str, Any]]:
    return [
        {
            "path": r["path"],
            "size_bytes": r["size_bytes"],
            "lines": r["lines"],
            "parsed": r["parsed"],
            "unparsed": r["unparsed"],
            "unparsed_by_reason": {k: r[k] for k in _REASONS if r[k]},
            "spliced": r["spliced"],
            "notes": analysis.notes.get(r["path"], []),
        }
        for r in analysis.inputs.sort("path").iter_rows(named=True)
    ]


def _job(analysis: Analysis) -> dict[str, Any]:
    ident = analysis.identity
    fw = analysis.frameworks
    timeout_s, timeout_source = fw.timeout
    ranks = [
        {
            "rank": r["rank"],
            "host": r["host"],
            "pid": r["pid"],
            "cuda_dev": r["cuda_dev"],
            "bus_id": r["bus_id"],
            "local_rank": r["local_rank"],
            "path": r["path"],
        }
        for r in ident.ranks.sort("rank").iter_rows(named=True)
    ]
    comms = [
        {
            "comm_id": r["comm_id"],
            "nranks": r["nranks"],
            "nnodes": r["nnodes"],
            "ranks_seen": r["ranks_seen"],
            "matched_by": r["matched_by"],
            "aborted": r["aborted"],
            "calls": r["calls"],
        }
        for r in analysis.communicators.iter_rows(named=True)
    ]
    return {
        "nccl_versions": analysis.nccl_versions,
        "cuda_versions": analysis.cuda_versions,
        "hosts": analysis.hosts,
        "world_size": analysis.world_size,
        "world_size_source": analysis.world_size_source,
        "ranks_without_logs": analysis.ranks_without_logs,
        "ranks": ranks,
        "communicators": comms,
        "transports": analysis.transports,
        "networks": analysis.networks,
        "timestamps": analysis.timestamps,
        "log_zone": analysis.log_zone or "UTC",
        "log_zone_source": analysis.log_zone_source,
        "log_zone_evidence": analysis.log_zone_evidence,
        "env": analysis.env,
        "zero": _zero(analysis),
        "timeout_s": timeout_s,
        "timeout_source": timeout_source,
        "frameworks": {
            "torch": {"seen": fw.torch_seen, "version": fw.torch_version},
            "deepspeed": {"seen": fw.deepspeed_seen, "version": fw.deepspeed_version},
        },
    }


def _zero(analysis: Analysis) -> dict[str, Any] | None:
    zero = analysis.frameworks.zero
    if zero is None:
        return None
    return {
        "stage": zero.stage,
        "offload_optimizer": zero.offload_optimizer,
        "offload_param": zero.offload_param,
        "overlap_comm": zero.overlap_comm,
        "reduce_bucket_size": zero.reduce_bucket_size,
        "allgather_bucket_size": zero.allgather_bucket_size,
    }


def _line(analysis: Analysis, file_id: int, line_no: int) -> dict[str, Any]:
    return {"path": analysis.paths[file_id], "line_no": line_no}


def _timeouts(analysis: Analysis) -> list[dict[str, Any]]:
    """One entry per (pg, rank, seq): the first line that reported it."""
    table = (
        analysis.frameworks.timeouts.sort("file_id", "line_no")
        .unique(["pg", "rank", "seq"], keep="first", maintain_order=True)
        .sort("pg", "seq", "rank", nulls_last=True)
    )
    return [
        {
            "rank": r["rank"],
            "global_rank": r["global_rank"],
            "pg": r["pg"],
            "seq": r["seq"],
            "op": r["op"],
            "numel_in": r["numel_in"],
            "numel_out": r["numel_out"],
            "timeout_s": r["timeout_s"],
            "ran_for_s": r["ran_for_s"],
            "host": r["host"],
            "last_enqueued": r["last_enqueued"],
            "last_completed": r["last_completed"],
            "first_line": _line(analysis, r["file_id"], r["line_no"]),
        }
        for r in table.iter_rows(named=True)
    ]


def _failures(analysis: Analysis) -> list[dict[str, Any]]:
    """torchelastic's summary entries; an agent ``failed (exitcode: ..)`` line only for a
    process the summary does not list (a log cut before the summary)."""
    failures = analysis.frameworks.failures
    summary = failures.filter(pl.col("source") == "summary")
    agent = failures.filter(
        (pl.col("source") != "summary")
        & ~pl.col("pid").is_in(summary["pid"].drop_nulls().implode())
    ).unique(["host", "pid"], keep="first", maintain_order=True)
    table = pl.concat([summary, agent]).sort(
        "rank", "local_rank", "file_id", "line_no", nulls_last=True
    )
    return [
        {
            "host": r["host"],
            "rank": r["rank"],
            "local_rank": r["local_rank"],
            "pid": r["pid"],
            "exitcode": r["exitcode"],
            "signal": r["signal"],
            "root_cause": r["root_cause"],
            "source": r["source"],
            "first_line": _line(analysis, r["file_id"], r["line_no"]),
        }
        for r in table.iter_rows(named=True)
    ]


def _timers(analysis: Analysis) -> dict[str, dict[str, Any]]:
    """Per normalised timer name: count, median and p95 (nearest rank) in seconds."""
    out: dict[str, dict[str, Any]] = {}
    timers = analysis.frameworks.timers
    for (name,), part in timers.group_by("name"):
        values = sorted(part["duration_s"].drop_nulls().to_list())
        if not values:
            continue
        out[str(name)] = {
            "count": len(values),
            "median_s": round(statistics.median(values), 6),
            "p95_s": round(values[math.ceil(0.95 * len(values)) - 1], 6),
        }
    return dict(sorted(out.items()))


def _collectives(analysis: Analysis) -> dict[str, Any]:
    summary = analysis.summary
    if summary is None:
        return {"calls": 0, "instances": 0, "by_op": {}, "by_op_size": []}
    return {
        "calls": summary.calls,
        "instances": summary.instances,
        "by_op": summary.by_op,
        "by_op_size": [
            {
                "op": r["op"],
                "size_bytes_min": r["size_bytes_min"],
                "calls": r["calls"],
                "total_bytes": r["total_bytes"],
            }
            for r in summary.by_op_size.iter_rows(named=True)
        ],
    }


def _errors(analysis: Analysis) -> list[dict[str, Any]]:
    """Root causes grouped per (process, kind, message shape), ordered by first line."""
    errors = analysis.errors
    if errors.is_empty():
        return []
    grouped = (
        errors.group_by(
            "file_id", "host", "pid", "kind", "severity", "signature", maintain_order=True
        )
        .agg(
            pl.col("rank").first(),
            pl.col("message").first(),
            pl.len().alias("count"),
            pl.col("line_no").first(),
            pl.col("src").first(),
            pl.col("hint").first(),
            pl.col("chain").first(),
            pl.col("ts").first(),
        )
        .sort("file_id", "line_no")
    )
    out = [
        {
            "host": r["host"],
            "pid": r["pid"],
            "rank": r["rank"],
            "kind": r["kind"],
            "severity": r["severity"],
            "message": r["message"],
            "count": r["count"],
            "first_line": {"path": analysis.paths[r["file_id"]], "line_no": r["line_no"]},
            "source": r["src"],
            "hint": r["hint"],
            "chain": r["chain"],
            "ts": r["ts"].isoformat() if r["ts"] is not None else None,
        }
        for r in grouped.iter_rows(named=True)
    ]
    return sorted(out, key=lambda e: (e["first_line"]["path"], e["first_line"]["line_no"]))


def _findings(diagnosis: Diagnosis) -> list[dict[str, Any]]:
    """Findings as the detectors ordered them: most severe, then most costly, first."""
    analysis = diagnosis.analysis
    out = []
    for f in diagnosis.findings:
        lines = [
            {
                "path": analysis.paths[ref.file_id] if ref.file_id < len(analysis.paths) else None,
                "line_no": ref.line_no,
                "text": diagnosis.quoted.get((ref.file_id, ref.line_no)),
            }
            for ref in f.lines
        ]
        out.append(
            {
                "kind": f.kind,
                "severity": f.severity,
                "ranks": f.ranks,
                "hosts": f.hosts,
                "op": f.op,
                "seq": f.seq,
                "message": f.message,
                "evidence": {**f.evidence, "lines": lines},
                "cost_gpu_s": None if f.cost_gpu_s is None else round(f.cost_gpu_s, 3),
                "hang_class": f.hang_class,
            }
        )
    return out
