"""The ``cluster`` object of ``analyze --format json`` and the report's CLUSTER section:
what was asked of Prometheus and, per port and GPU, what its exporters said (a summary:
the samples themselves are ``ClusterTables``' tables)."""

from __future__ import annotations

from typing import Any

import polars as pl

from ncclscope.cluster.tables import ClusterTables
from ncclscope.units import SLOWDOWN_BITS

__all__ = ["cluster_doc", "cluster_lines"]

#: Port gauges' healthy values (``state_id`` 4: ACTIVE; ``physical_state_id`` 5: LinkUp).
_HEALTHY = {"state_id": 4.0, "physical_state_id": 5.0}
_REASONS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
_XID = "DCGM_FI_DEV_XID_ERRORS"
#: The clocks-event reasons' "idle" bit (0x1): not an event.
_IDLE = 0x1
#: Lines of ports or GPUs shown in the text report before "and N more".
_SHOWN = 10


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def _ports(t: ClusterTables) -> list[dict[str, Any]]:
    p = t.ports
    if p.is_empty():
        return []
    key = ["host", "device", "port"]
    errors: dict[tuple[str, str, str], dict[str, float]] = {}
    inc = (
        p.filter(pl.col("kind") == "increase").group_by([*key, "metric"]).agg(pl.col("value").sum())
    )
    for h, d, q, m, v in inc.sort("metric").iter_rows():
        errors.setdefault((h, d, q), {})[m] = v

    def rate(metric: str, name: str) -> pl.Expr:
        hit = (pl.col("kind") == "rate_per_s") & (pl.col("metric") == metric)
        return pl.col("value").filter(hit).max().alias(name)

    healthy = pl.col("metric").replace_strict(_HEALTHY, default=None, return_dtype=pl.Float64)
    down = pl.col("metric").is_in(list(_HEALTHY)) & (pl.col("value") != healthy)
    cap = pl.col("metric") == "rate_bytes_per_second"
    per = (
        p.sort("ts")
        .group_by(key)
        .agg(
            rate("port_transmit_wait_total", "transmit_wait_max_per_s"),
            rate("port_data_transmitted_bytes_total", "transmitted_bytes_max_per_s"),
            pl.col("value").filter(cap).last().alias("capacity_bytes_per_second"),
            pl.col("ts").filter(down).n_unique().alias("not_active_samples"),
        )
        .sort(key)
    )
    return [
        {
            "host": r["host"],
            "device": r["device"],
            "port": r["port"],
            "errors": errors.get((r["host"], r["device"], r["port"]), {}),
            "transmit_wait_max_per_s": r["transmit_wait_max_per_s"],
            "transmitted_bytes_max_per_s": r["transmitted_bytes_max_per_s"],
            "capacity_bytes_per_second": r["capacity_bytes_per_second"],
            "not_active_samples": r["not_active_samples"],
        }
        for r in per.iter_rows(named=True)
    ]


def _gpus(t: ClusterTables) -> list[dict[str, Any]]:
    # Only the GPUs with something to say: increases, XIDs, clocks-event reasons that
    # slow a GPU for its hardware's sake (a power cap alone is a loaded GPU's normal
    # state; its bits are said with the others where one of those is there).
    bits = pl.col("value").cast(pl.Int64, strict=False)
    reason = pl.col("metric").is_in(_REASONS) & ((bits & SLOWDOWN_BITS) > 0)
    xid = (pl.col("metric") == _XID) & (pl.col("value") != 0)
    g = t.gpus.filter((pl.col("kind") == "increase") | reason | xid)
    if g.is_empty():
        return []
    key = ["host", "gpu"]
    out: list[dict[str, Any]] = []
    for (host, gpu), part in sorted(g.group_by(key), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        inc = (
            part.filter(pl.col("kind") == "increase").group_by("metric").agg(pl.col("value").sum())
        )
        xids = part.filter(pl.col("metric") == _XID)["value"]
        reasons = part.filter(pl.col("metric").is_in(_REASONS))["value"]
        mask = 0
        for v in reasons.to_list():
            mask |= int(v) & ~_IDLE
        uuid = part["uuid"].drop_nulls()
        out.append(
            {
                "host": host,
                "gpu": gpu,
                "uuid": uuid[0] if len(uuid) else None,
                "errors": {m: v for m, v in inc.sort("metric").iter_rows()},
                "xids": sorted({int(v) for v in xids.to_list()}),
                "clocks_event_reasons": mask or None,
            }
        )
    return out


def cluster_doc(t: ClusterTables | None) -> dict[str, Any] | None:
    """The JSON ``cluster`` object (None without ``--prometheus``)."""
    if t is None:
        return None
    return {
        "url": t.url,
        "start": _iso(t.start),
        "end": _iso(t.end),
        "step_s": t.step_s,
        "requests": len(t.asks),
        "series": sum(a.series for a in t.asks),
        "samples": sum(a.samples for a in t.asks),
        "seconds": round(sum(a.seconds for a in t.asks), 3),
        "asks": [
            {
                "what": a.what,
                "status": a.status,
                "series": a.series,
                "samples": a.samples,
                "seconds": a.seconds,
                "message": a.message,
            }
            for a in t.asks
        ],
        "instances": [
            {k: r[k] for k in ("instance", "job", "host", "how")}
            for r in t.instances.iter_rows(named=True)
        ],
        "problems": list(t.problems),
        "ports": _ports(t),
        "gpus": _gpus(t),
        "telemetry_samples": len(t.telemetry),
    }


def cluster_lines(doc: dict[str, Any] | None) -> list[str]:
    """The report's CLUSTER section from the JSON object (nothing without one)."""
    if doc is None:
        return []
    span = f"{doc['start']} .. {doc['end']}" if doc["start"] else "no window"
    step = f", every {doc['step_s']:g} s" if doc["step_s"] else ""
    out = [
        f"CLUSTER (Prometheus {doc['url']})",
        f"  {span}{step}: {doc['requests']} request{'' if doc['requests'] == 1 else 's'}, "
        f"{doc['series']:,} series, "
        f"{doc['samples']:,} samples, {doc['seconds']:.2f} s",
    ]
    for a in doc["asks"]:
        said = f": {a['message']}" if a["message"] else ""
        n = f"{a['series']:>6} series"
        out.append(f"    {a['what']:<13} {a['status']:<11} {n} {a['seconds']:6.2f} s{said}")
    matched = [i for i in doc["instances"] if i["host"]]
    hosts = sorted({i["host"] for i in matched})
    if doc["instances"]:
        out.append(f"  instances: {len(matched)} matched to {len(hosts)} log hosts")
    out.extend(
        f"    unmatched: {i['instance']} (job {i['job']}, tried {i['how']})"
        for i in [i for i in doc["instances"] if not i["host"]][:_SHOWN]
    )
    ports = doc["ports"]
    if ports:
        bad = [p for p in ports if p["errors"] or p["not_active_samples"]]
        out.append(f"  InfiniBand ports: {len(ports)}, {len(bad)} with errors or down")
        for p in bad[:_SHOWN]:
            errs = ", ".join(f"{m} +{v:g}" for m, v in p["errors"].items())
            down = (
                f", not active at {p['not_active_samples']} steps"
                if p["not_active_samples"]
                else ""
            )
            out.append(
                f"    {p['host']} {p['device']} port {p['port']}: {errs or 'no errors'}{down}"
            )
        if len(bad) > _SHOWN:
            out.append(f"    and {len(bad) - _SHOWN} more")
    gpus = doc["gpus"]
    if gpus:
        out.append(f"  GPUs with events: {len(gpus)}")
        for g in gpus[:_SHOWN]:
            parts = [f"{m.removeprefix('DCGM_FI_DEV_')} +{v:g}" for m, v in g["errors"].items()]
            if g["xids"]:
                parts.append("XID " + ", ".join(str(x) for x in g["xids"]))
            if g["clocks_event_reasons"]:
                parts.append(f"clocks event reasons 0x{g['clocks_event_reasons']:x}")
            out.append(f"    {g['host']} gpu {g['gpu']}: " + "; ".join(parts))
        if len(gpus) > _SHOWN:
            out.append(f"    and {len(gpus) - _SHOWN} more")
    if doc["telemetry_samples"]:
        out.append(f"  the agent's series: {doc['telemetry_samples']:,} samples")
    out.extend(f"  problem: {p}" for p in doc["problems"])
    out.append("")
    return out
