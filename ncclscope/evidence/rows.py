"""The agent's rows from its last evidence folder: what it asked and what answered, each
local process's state and stack, RAS's dead, missing and mismatched ranks, and the
collectives the dumps say each rank last enqueued, started and completed.

Computed once per collection (in the collector's thread), then set on the board as
they are: nothing here runs per tick or per scrape.
"""

from __future__ import annotations

from pathlib import Path

from ncclscope.evidence.manifest import Manifest
from ncclscope.evidence.read import RankView, read_evidence

__all__ = ["evidence_rows"]

Rows = dict[str, list[tuple[tuple[str, ...], float]]]


def evidence_rows(manifest: Manifest, folder: Path, collections: int) -> Rows:
    """Catalog rows of one node's folder (``folder/manifest.json`` holds ``manifest``)."""
    rows: Rows = {"ncclscope_evidence_collections_total": [((), float(collections))]}
    counts: dict[tuple[str, str], int] = {}
    for a in manifest.asks:
        counts[(a.what, a.outcome)] = counts.get((a.what, a.outcome), 0) + 1
    rows["ncclscope_evidence_asks"] = [(k, float(n)) for k, n in sorted(counts.items())]
    ev = read_evidence([folder / "manifest.json"])
    info = [_rank_row(v) for v in ev.ranks if v.rank is not None]
    if info:
        rows["ncclscope_evidence_rank_info"] = info
    ras = _ras_rows(ev.ras_files)
    if ras:
        rows["ncclscope_ras_rank_problem_info"] = ras
    flight = _flight_rows(ev.dump_files)
    if flight:
        rows["ncclscope_flight_last_collective_seq"] = flight
    return rows


def _rank_row(v: RankView) -> tuple[tuple[str, ...], float]:
    return (
        (
            str(v.rank),
            str(v.pid or ""),
            v.state or "unknown",
            v.stack_kind or "none",
            v.frame or "",
        ),
        1.0,
    )


def _ras_rows(files: list[Path]) -> list[tuple[tuple[str, ...], float]]:
    from ncclscope.parsers.tools.ras import parse_ras_json, parse_ras_text

    out: dict[tuple[str, ...], float] = {}
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        read = (parse_ras_json if path.suffix == ".json" else parse_ras_text)(text, str(path))
        for r in read.ranks.iter_rows(named=True):
            state = r["state"]
            if state not in ("missing", "dead", "unresponsive", "mismatch", "error"):
                continue
            rank = r["comm_rank"]
            labels = (
                str(r["comm_hash"] or ""),
                "" if rank is None else str(rank),
                str(r["host"] or ""),
                str(state),
            )
            out[labels] = 1.0
    return sorted(out.items())


def _flight_rows(files: list[Path]) -> list[tuple[tuple[str, ...], float]]:
    from ncclscope.parsers.torch.flight import read_dump, sniff_dump

    out: list[tuple[tuple[str, ...], float]] = []
    for path in files:
        try:
            with path.open("rb") as fh:
                kind = sniff_dump(fh.read(8192))
        except OSError:
            continue
        if kind is None:
            continue
        d = read_dump(path, str(path), kind)
        if d.problem is not None or d.rank is None:
            continue
        for pg, enq, started, done in d.status:
            for state, seq in (("enqueued", enq), ("started", started), ("completed", done)):
                if seq is not None and seq >= 0:
                    out.append(((str(d.rank), str(pg), state), float(seq)))
    return out
