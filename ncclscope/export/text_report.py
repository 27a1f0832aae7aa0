"""The terminal summary of ``analyze``: what a person reads in ten seconds."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

from ncclscope import __version__
from ncclscope.cluster.summary import cluster_lines
from ncclscope.diagnose import Diagnosis
from ncclscope.export.json_report import FLIGHT_JOIN_WHY, to_json_dict
from ncclscope.model.identity import listable_size
from ncclscope.model.inspector import INSPECTOR_UNJOINED
from ncclscope.units import human_bytes, rank_ranges

__all__ = ["render_text"]

_MAX_ERRORS = 8
#: Findings whose ``evidence.gpus`` is a table of the rank's GPUs (bus id, memory).
_GPU_TABLES = ("pcie_contention", "oom_risk")
_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def render_text(diagnosis: Diagnosis, *, doc: dict[str, Any] | None = None) -> str:
    """Render the summary; ``doc`` is the JSON document if already built."""
    doc = doc if doc is not None else to_json_dict(diagnosis)
    out: list[str] = []
    _header(out, doc)
    _findings(out, doc)
    _job(out, doc)
    _evidence(out, doc)
    out.extend(cluster_lines(doc.get("cluster")))
    _flight(out, doc)
    _tools(out, doc)
    _framework(out, doc)
    _timeouts(out, doc)
    _failures(out, doc)
    if _has_nccl(doc):
        _collectives(out, doc)
        _errors(out, doc)
    _timers(out, doc)
    _gaps(out, doc)
    _inputs(out, doc)
    return "\n".join(out).rstrip() + "\n"


def _header(out: list[str], doc: dict[str, Any]) -> None:
    inputs = doc["inputs"]
    lines = sum(i["lines"] for i in inputs)
    parsed = sum(i["parsed"] for i in inputs)
    noun = "input" if len(inputs) == 1 else "inputs"
    head = f"ncclscope {__version__}: {len(inputs)} {noun}, {lines:,} lines, {parsed:,} parsed"
    dumps = doc["flight_recorder"]["dumps"]
    if dumps:
        head += f"; {len(dumps)} Flight Recorder dump{'s' if len(dumps) > 1 else ''}"
    folders = doc["evidence"]["folders"]
    if folders:
        head += f"; {len(folders)} evidence folder{'s' if len(folders) > 1 else ''}"
    tools = [f for f in doc["nccl_tools"]["files"] if f["kind"] != "nccl_tests"]
    if tools:
        head += f"; {len(tools)} NCCL tool output{'s' if len(tools) > 1 else ''}"
    out.append(head)
    out.append("")


def _has_nccl(doc: dict[str, Any]) -> bool:
    job = doc["job"]
    return bool(
        job["nccl_versions"] or job["ranks"] or job["hosts"] or doc["collectives"]["calls"]
    ) or bool(doc["errors"])


#: How the world size was read, where it was not from NCCL's Init lines.
_WORLD_FROM = {"coll": "from COLL lines", "launcher": "as the launcher states it"}


def _job(out: list[str], doc: dict[str, Any]) -> None:
    job = doc["job"]
    if not _has_nccl(doc):
        out.append("JOB")
        out.append("  no NCCL lines in these logs (NCCL_DEBUG=INFO adds them)")
        if job["world_size"] is not None:
            out.append(f"  world size {job['world_size']} (as the launcher states it)")
        out.append("")
        return
    versions = ", ".join(job["nccl_versions"]) or "unknown"
    cuda = ", ".join(job["cuda_versions"])
    world = job["world_size"] if job["world_size"] is not None else "unknown"
    if job["world_size_source"] in _WORLD_FROM:
        world = f"{world} ({_WORLD_FROM[job['world_size_source']]})"
    nhosts = len(job["hosts"])
    out.append("JOB")
    out.append(
        f"  NCCL {versions}"
        + (f" (CUDA {cuda})" if cuda else "")
        + f" · {nhosts} host{'s' if nhosts != 1 else ''} · world size {world}"
        + f" · NCCL timestamps: {job['timestamps']}"
    )
    if job["timestamps"] != "none" or job["frameworks"]["deepspeed"]["seen"]:
        # Loggers print local time without a zone: which one was assumed matters
        # wherever a time meets another clock (telemetry, the agent's, a reader's).
        zone = job["log_zone"]
        said = {"given": "(--log-tz)", "telemetry": "(learned by the agent)"}
        source = job["log_zone_source"]
        evidence = job.get("log_zone_evidence")
        if source in said:
            out.append(f"  times read as {zone} {said[source]}")
        elif source == "learned":
            out.append(f"  times read as {zone}: {evidence} (--log-tz overrides)")
        else:
            out.append(
                f"  times read as {zone}: "
                + (f"{evidence}; " if evidence else "the logs name no zone ")
                + "(--log-tz sets the one they were written in)"
            )
    by_host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rank in job["ranks"]:
        by_host[rank["host"]].append(rank)
    if by_host:
        out.append("  ranks per host (rank:GPU bus id):")
        for host in sorted(by_host, key=lambda h: min(r["rank"] for r in by_host[h])):
            cells = " ".join(f"{r['rank']}:{r['bus_id'] or '?'}" for r in by_host[host])
            out.append(f"    {host:<20} {len(by_host[host]):>3} ranks  {cells}")
    elif job["hosts"]:
        out.append(f"  hosts: {', '.join(job['hosts'])} (no init lines: ranks unknown)")
    if job["communicators"]:
        out.append(f"  communicators ({len(job['communicators'])}):")
        for comm in job["communicators"][:10]:
            seen = len(comm["ranks_seen"])
            ident = comm["comm_id"] or f"(no commId, matched by {comm['matched_by']})"
            out.append(
                f"    {ident:<20} {comm['nranks']:>5} ranks on {comm['nnodes']} node(s), "
                f"{seen} seen, {comm['calls']:,} calls"
            )
        if len(job["communicators"]) > 10:
            out.append(f"    ... {len(job['communicators']) - 10} more (--format json lists all)")
    if job["ranks_without_logs"]:
        missing = job["ranks_without_logs"]
        out.append(
            f"  no lines from rank{'s' if len(missing) > 1 else ''} {rank_ranges(missing)}: "
            "their files are not among the inputs, or the excerpt left them out"
        )
    if len(doc["attempts"]) > 1:
        out.append(f"  runs in these logs ({len(doc['attempts'])}; the job above is the last):")
        for a in doc["attempts"]:
            where = ", ".join(
                f"{Path(s['path']).name}:{s['first_line']}-{s['last_line'] or 'end'}"
                for s in a["spans"][:3]
            )
            more = f" +{len(a['spans']) - 3} files" if len(a["spans"]) > 3 else ""
            out.append(
                f"    #{a['index']} started by {', '.join(a['started_by'])}: "
                f"{len(a['hosts'])} host(s), ranks {rank_ranges(a['ranks']) or '?'}, "
                f"{len(a['findings'])} findings  ({where}{more})"
            )
    if job["transports"]:
        nets = f" (network plugin: {', '.join(job['networks'])})" if job["networks"] else ""
        out.append(f"  transports: {', '.join(job['transports'])}{nets}")
    out.append("")


def _collectives(out: list[str], doc: dict[str, Any]) -> None:
    coll = doc["collectives"]
    out.append("COLLECTIVES")
    if not coll["calls"]:
        out.append("  none logged (COLL lines need NCCL_DEBUG_SUBSYS=INIT,COLL)")
        out.append("")
        return
    out.append(f"  {coll['calls']:,} calls, {coll['instances']:,} instances matched across ranks")
    sizes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in coll["by_op_size"]:
        sizes[row["op"]].append(row)
    out.append(f"  {'op':<16} {'calls':>12} {'bytes':>12}  message sizes")
    for op, calls in sorted(coll["by_op"].items(), key=lambda kv: -kv[1]):
        rows = sizes.get(op, [])
        total = sum(r["total_bytes"] or 0 for r in rows)
        lo = min((r["size_bytes_min"] for r in rows), default=0)
        hi = max((r["size_bytes_min"] for r in rows), default=0)
        span = human_bytes(lo) if lo == hi else f"{human_bytes(lo)} .. {human_bytes(hi * 4)}"
        out.append(f"  {op:<16} {calls:>12,} {human_bytes(total):>12}  {span}")
    out.append("")


def _errors(out: list[str], doc: dict[str, Any]) -> None:
    errors = doc["errors"]
    out.append("ERRORS")
    if not errors:
        out.append("  no NCCL WARN lines")
        out.append("")
        return
    ordered = sorted(errors, key=lambda e: _SEVERITY_ORDER.get(e["severity"], 3))
    first = errors[0]
    out.append(
        f"  first root cause: {first['kind']} on {first['host']}"
        + (f" rank {first['rank']}" if first["rank"] is not None else "")
        + f" ({first['first_line']['path']}:{first['first_line']['line_no']})"
    )
    for err in ordered[:_MAX_ERRORS]:
        where = f"{err['first_line']['path']}:{err['first_line']['line_no']}"
        who = f"{err['host']} pid {err['pid']}" + (
            f" rank {err['rank']}" if err["rank"] is not None else ""
        )
        times = f" x{err['count']}" if err["count"] > 1 else ""
        out.append(f"  [{err['severity']}] {err['kind']}{times}  {who}  {where}")
        out.append(f"      {_cut(err['message'], 110)}")
        if err["hint"]:
            out.append(
                textwrap.fill(
                    err["hint"], 110, initial_indent="      means: ", subsequent_indent=" " * 13
                )
            )
        if err["chain"]:
            chain = " <- ".join(err["chain"][:3])
            more = f" (+{len(err['chain']) - 3})" if len(err["chain"]) > 3 else ""
            out.append(f"      chain: {chain}{more}")
    if len(errors) > _MAX_ERRORS:
        out.append(f"  ... {len(errors) - _MAX_ERRORS} more (--format json lists all)")
    out.append("")


#: Findings shown in full; the rest are counted (JSON lists all).
_MAX_FINDINGS = 8


def _findings(out: list[str], doc: dict[str, Any]) -> None:
    """What is wrong, most severe and most costly first, each with its evidence.  Advice
    about missing signals (``info`` config findings) is left to WHAT THESE LOGS CANNOT
    TELL below."""
    shown = [f for f in doc["findings"] if not (f["kind"] == "config" and f["severity"] == "info")]
    out.append("FINDINGS")
    if not shown:
        out.append("  nothing wrong found in what these logs show")
        out.append("")
        return
    for f in shown[:_MAX_FINDINGS]:
        cost = f"  ~{f['cost_gpu_s']:,.0f} GPU-s lost" if (f["cost_gpu_s"] or 0) >= 1 else ""
        label = f["kind"] + (f" ({f['hang_class']})" if f["hang_class"] else "")
        out.append(f"  [{f['severity']}] {label}{cost}")
        out.append(
            textwrap.fill(f["message"], 110, initial_indent="      ", subsequent_indent="      ")
        )
        if f["evidence"].get("hint"):
            out.append(
                textwrap.fill(
                    f["evidence"]["hint"],
                    110,
                    initial_indent="      means: ",
                    subsequent_indent=" " * 13,
                )
            )
        if f["kind"] == "zero_stage":
            out.extend(_zero_stage_table(f["evidence"]))
        gpus = f["evidence"].get("gpus", []) if f["kind"] in _GPU_TABLES else []
        for gpu in gpus[:8]:
            extra = (
                f"  peak {gpu['peak_bytes'] / 2**30:.1f} of {gpu['total_bytes'] / 2**30:.1f} GiB"
                if "peak_bytes" in gpu
                else ""
            )
            out.append(f"      rank {gpu['rank']}: GPU {gpu['gpu']} ({gpu['pci_bus_id']}){extra}")
        out.extend(  # pcie_contention: what to try
            textwrap.fill(tip, 110, initial_indent="      try: ", subsequent_indent=" " * 11)
            for tip in f["evidence"].get("suggestions", [])
        )
        for line in f["evidence"]["lines"][:3]:
            out.append(f"      {line['path']}:{line['line_no']}")
            out.append(f"        {_cut((line['text'] or '').strip(), 112)}")
    if len(shown) > _MAX_FINDINGS:
        out.append(f"  ... {len(shown) - _MAX_FINDINGS} more (--format json lists all)")
    out.append("")


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def _zero_stage_table(ev: dict[str, Any]) -> list[str]:
    """The ZeRO advisor's estimate per configuration, then its inputs and their sources."""
    out: list[str] = []
    if ev["options"]:
        out.append(
            f"      {'configuration':<44} {'states':>7} {'peak':>7} {'fits':>5} "
            f"{'comm/step':>10} {'step':>9}"
        )
        for o in ev["options"]:
            name = "DDP" if o["stage"] == 0 else f"ZeRO-{o['stage']}"
            off = [w for w in ("optimizer", "param") if o[f"offload_{w}"]]
            if off:
                name += " + offload " + ", ".join(off)
            mark = " (current)" if o["current"] else ""
            if ev["recommended"] == {
                k: o[k] for k in ("stage", "offload_optimizer", "offload_param")
            }:
                mark = " (advised)"
            fits = {True: "yes", False: "no", None: "?"}[o["fits"]]
            comm = "-" if o["comm_s"] is None else f"{o['comm_s'] * 1000:.0f} ms"
            step = "-" if o["step_s"] is None else f"{o['step_s'] * 1000:.0f} ms"
            out.append(
                f"      {name + mark:<44} {_gib(o['model_states_bytes']):>7} "
                f"{_gib(o['peak_bytes']):>7} {fits:>5} {comm:>10} {step:>9}"
            )
        out.append("      (GiB per GPU; comm as if not overlapped)")
    for i in ev["inputs"]:
        value = i["value"]
        name = i["name"]
        if name.endswith("_bytes") and name != "weight_bytes":
            shown = f"{value / 2**30:.2f} GiB"
        elif name.endswith("_bytes_per_s"):
            shown = f"{value / 1e9:.1f} GB/s"
        elif name.endswith("_s"):
            shown = f"{value * 1000:.1f} ms"
        else:
            shown = f"{value:,.0f}"
        out.append(f"      {i['name']}: {shown}  <- {i['source']}")
    out.extend(f"      missing: {m}" for m in ev["missing"])
    return out


def _gaps(out: list[str], doc: dict[str, Any]) -> None:
    if not doc["gaps"]:
        return
    out.append("WHAT THESE LOGS CANNOT TELL")
    for gap in doc["gaps"]:
        out.append(f"  - {gap['what']}")
        out.append(f"    add: {'; '.join(gap['settings'])}")
    out.append("")


def _evidence(out: list[str], doc: dict[str, Any]) -> None:
    """What each process gave the agents at the stall (evidence folders)."""
    ev = doc["evidence"]
    if not ev["folders"]:
        return
    out.append("EVIDENCE (taken at the stall by the agents)")
    for f in ev["folders"]:
        asks = ", ".join(
            f"{what} " + "/".join(f"{n} {outcome}" for outcome, n in sorted(by.items()))
            for what, by in sorted(f["asks"].items())
        )
        done = "" if f["complete"] else " (incomplete)"
        out.append(f"  {f['host']} at {f['written_utc']}{done}: {asks}")
    for p in ev["processes"]:
        who = f"rank {p['rank']}" if p["rank"] is not None else f"pid {p['pid']}"
        where = f"{p['stack']} at {p['frame']}" if p["stack"] else "no stack"
        why = f" ({'; '.join(p['why'])})" if p["why"] and not p["stack"] else ""
        out.append(f"  {p['host']} {who}: {p['state'] or 'state unknown'}, {where}{why}")
    out.append("")


def _flight(out: list[str], doc: dict[str, Any]) -> None:
    """What the Flight Recorder dumps say, apart from the logs."""
    fr = doc["flight_recorder"]
    read = [d for d in fr["dumps"] if d["problem"] is None]
    if not fr["dumps"]:
        return
    formats = sorted({d["format"] for d in read})
    versions = ", ".join(fr["versions"]) or "none"
    groups = fr["process_groups"]
    out.append("FLIGHT RECORDER (from the dumps, not the logs)")
    out.append(
        f"  {len(read)} dump{'s' if len(read) != 1 else ''} read, {len(fr['ranks'])} "
        f"rank{'s' if len(fr['ranks']) != 1 else ''} ({rank_ranges(fr['ranks']) or '-'}), "
        f"{len(groups)} process group{'s' if len(groups) != 1 else ''}, "
        f"{fr['entries']:,} entries ({'/'.join(formats) or '-'}, version {versions})"
    )
    skipped = sum(d["skipped"] for d in read)
    refused = len(fr["dumps"]) - len(read)
    states = fr["entries_by_state"]
    extra = f"; {skipped:,} entries skipped" if skipped else ""
    extra += f"; {refused} dump{'s' if refused > 1 else ''} not read" if refused else ""
    out.append(
        f"  states as written: {states['scheduled']:,} scheduled, {states['started']:,} "
        f"started, {states['completed']:,} completed; {fr['completed']:,} completed per "
        f"the group status{extra}"
    )
    for g in groups:
        name = g["name"] + (f" ({g['desc']})" if g["desc"] else "")
        seen = rank_ranges(g["ranks_with_entries"]) or "none"
        size = f"{len(g['ranks'])} ranks" if g["ranks"] else f"members unknown (calls from {seen})"
        if g["join"] == "joined":
            how = (
                f"joined to communicator {g['comm_key']}: COLL seq = collective_seq_id "
                f"{g['seq_offset']:+d}, {g['agreed']:,} of {g['checked']:,} calls agree"
            )
        else:
            how = f"not joined to the logs: {FLIGHT_JOIN_WHY.get(g['join'], g['join'])}"
        out.append(f"  group {name}, {size}, {g['entries']:,} entries: {how}")
    out.append("")


def _gbs(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.1f} GB/s"


def _tools(out: list[str], doc: dict[str, Any]) -> None:
    """What NCCL's own tools wrote (Inspector, nccl-tests, RAS), apart from the logs."""
    t = doc["nccl_tools"]
    if not t["files"]:
        return
    out.append("NCCL TOOLS (from Inspector, nccl-tests and RAS outputs, not the logs)")
    ins = t["inspector"]
    n_ins = sum(1 for f in t["files"] if f["kind"] == "inspector")
    if n_ins:
        ops = ", ".join(
            f"{o['op']} {o['records']:,} (median {_secs(o['median_exec_time_s'])}, "
            f"bus {_gbs(o['median_bus_bw_bytes_per_s'])})"
            for o in ins["by_op"]
        )
        out.append(
            f"  Inspector: {ins['records']:,} records from {n_ins} file"
            f"{'s' if n_ins != 1 else ''} ({len(ins['hosts'])} host"
            f"{'s' if len(ins['hosts']) != 1 else ''}, {len(ins['communicators'])} "
            f"communicator{'s' if len(ins['communicators']) != 1 else ''}, format "
            f"{', '.join(ins['versions']) or '-'}); joined to COLL lines: {ins['joined']:,}"
            f" ({ins['joined_size_agrees']:,} with the same size)"
        )
        if ins["not_joined_why"]:
            why = INSPECTOR_UNJOINED.get(ins["not_joined_why"], ins["not_joined_why"])
            out.append(f"    not joined to the logs: {why}; Inspector's times are read alone")
        if ops:
            out.append(f"    {ops}")
    for run in t["nccl_tests"]["runs"]:
        table = run["table"]
        peak = max((r["oop_bus_bw_bytes_per_s"] or 0.0 for r in table), default=0.0)
        version = f"nccl-tests {run['version']}" if run["version"] else "nccl-tests"
        out.append(
            f"  {run['path']}: {version} {run['test'] or 'unknown test'}, "
            f"{run['ranks'] or '?'} ranks on {len(run['hosts'])} host"
            f"{'s' if len(run['hosts']) != 1 else ''}, {run['rows']} sizes"
            f" ({human_bytes(table[0]['size_bytes']) if table else '-'}"
            f"-{human_bytes(table[-1]['size_bytes']) if table else '-'}), peak bus "
            f"{_gbs(peak)}, avg bus {_gbs(run['avg_bus_bw_bytes_per_s'])}"
            + (f"; {run['wrong']} sizes with wrong results" if run["wrong"] else "")
        )
    for rep in t["ras"]["reports"]:
        errs = sorted({c["errors"] for c in rep["comms"] if c["errors"] != "OK"})
        out.append(
            f"  {rep['path']}: RAS report ({rep['format']}), NCCL {rep['nccl_version'] or '?'}"
            f", {rep['nodes'] or '?'} nodes, {rep['processes'] or '?'} processes, "
            f"{rep['communicators']} communicators; errors: {', '.join(errs) or 'none'}"
            + (f"; {rep['dead_processes']} dead" if rep["dead_processes"] else "")
            + (f"; {rep['missing_processes']} missing" if rep["missing_processes"] else "")
        )
        for r in rep["ranks"]:
            where = f"rank {r['comm_rank']}" if r["comm_rank"] is not None else "process"
            comm = f" of {r['comm_hash']}" if r["comm_hash"] else ""
            out.append(
                f"    {r['state']}: {where}{comm}, pid {r['pid']} on {r['host']}"
                + (f", {r['detail']}" if r["detail"] else "")
            )
    out.append("")


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e6:,.0f} us"


def _inputs(out: list[str], doc: dict[str, Any]) -> None:
    notes = [f"  {inp['path']}: {note}" for inp in doc["inputs"] for note in inp["notes"]]
    for f in doc["nccl_tools"]["files"]:
        notes += [f"  {f['path']}: {note}" for note in f["notes"]]
        notes += [
            f"  {f['path']}: {n:,} skipped: {reason}"
            for reason, n in f["skipped_by_reason"].items()
        ]
    for d in doc["flight_recorder"]["dumps"]:
        notes += [f"  {d['path']}: {note}" for note in d["notes"]]
        notes += [
            f"  {d['path']}: {n:,} entr{'ies' if n > 1 else 'y'} skipped: {reason}"
            for reason, n in d["skipped_by_reason"].items()
        ]
    notes.extend(f"  {p['path']}: {p['reason']}" for p in doc["problems"])
    if notes:
        out.append("INPUT PROBLEMS (skipped lines are counted; no valid line around them was lost)")
        out.extend(notes)
        out.append("")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _framework(out: list[str], doc: dict[str, Any]) -> None:
    job = doc["job"]
    fw = job["frameworks"]
    if not (fw["torch"]["seen"] or fw["deepspeed"]["seen"] or job["zero"]):
        return
    out.append("FRAMEWORK")
    seen = []
    for name, label in (("torch", "PyTorch"), ("deepspeed", "DeepSpeed")):
        if fw[name]["seen"]:
            seen.append(label + (f" {fw[name]['version']}" if fw[name]["version"] else ""))
    out.append(f"  {' · '.join(seen)}")
    zero = job["zero"]
    if zero:
        offload = [
            f"{what} -> {zero[key]}"
            for key, what in (("offload_optimizer", "optimizer"), ("offload_param", "params"))
            if zero[key] not in (None, "none")
        ]
        parts = [f"ZeRO stage {zero['stage'] if zero['stage'] is not None else '?'}"]
        parts.append("offload: " + (", ".join(offload) if offload else "none"))
        if zero["overlap_comm"] is not None:
            parts.append(f"overlap_comm {zero['overlap_comm']}")
        if zero["reduce_bucket_size"]:
            parts.append(f"reduce bucket {zero['reduce_bucket_size']:,} elements")
        out.append("  " + " · ".join(parts))
    if job["timeout_s"] is not None:
        how = "stated by the logs" if job["timeout_source"] == "logged" else "framework default"
        out.append(f"  collective timeout: {job['timeout_s']:g} s ({how})")
    out.append("")


def _timeouts(out: list[str], doc: dict[str, Any]) -> None:
    timeouts = doc["timeouts"]
    if not timeouts:
        return
    out.append("TIMEOUTS (PyTorch watchdog)")
    groups: dict[tuple[Any, Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for t in timeouts:
        groups[(t["pg"], t["seq"], t["op"])].append(t)
    world = doc["job"]["world_size"]
    for (pg, seq, op), rows in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        ranks = sorted({r for r in (_who(t) for t in rows) if r is not None})
        first = rows[0]["first_line"]
        where = f"{first['path']}:{first['line_no']}"
        timeout = rows[0]["timeout_s"]
        after = f" after {timeout:g} s" if timeout is not None else ""
        out.append(
            f"  {op or 'a collective'} #{seq} on PG {pg if pg is not None else '?'}: "
            f"{len(rows)} rank(s) timed out{after}  ({where})"
        )
        if ranks:
            out.append(f"      waiting: ranks {rank_ranges(ranks)}")
        if isinstance(world, int) and listable_size(world) and ranks and len(ranks) < world:
            missing = sorted(set(range(world)) - set(ranks))
            noun = "rank" if len(missing) == 1 else "ranks"
            out.append(
                f"      not reporting: {noun} {rank_ranges(missing)} (suspect: it never joined)"
            )
    out.append("")


def _who(t: dict[str, Any]) -> int | None:
    rank = t["global_rank"] if t["global_rank"] is not None else t["rank"]
    return rank if isinstance(rank, int) else None


def _failures(out: list[str], doc: dict[str, Any]) -> None:
    failures = doc["failures"]
    if not failures:
        return
    out.append("PROCESS FAILURES (torchelastic)")
    for f in failures[:_MAX_ERRORS]:
        who = f"rank {f['rank']}" if f["rank"] is not None else f"local rank {f['local_rank']}"
        sig = f" ({f['signal']})" if f["signal"] else ""
        root = "  <- first observed failure" if f["root_cause"] else ""
        host = f" on {f['host']}" if f["host"] else ""
        out.append(f"  {who}{host}: exit code {f['exitcode']}{sig}{root}")
    if len(failures) > _MAX_ERRORS:
        out.append(f"  ... {len(failures) - _MAX_ERRORS} more (--format json lists all)")
    out.append("")


def _timers(out: list[str], doc: dict[str, Any]) -> None:
    timers = doc["timers"]
    if not timers:
        return
    out.append("DEEPSPEED TIMERS (rank 0)")
    out.append(f"  {'timer':<28} {'count':>7} {'median':>10} {'p95':>10}")
    for name, t in timers.items():
        median, p95 = t["median_s"] * 1e3, t["p95_s"] * 1e3
        out.append(f"  {name:<28} {t['count']:>7,} {median:>8.1f}ms {p95:>8.1f}ms")
    out.append("")
