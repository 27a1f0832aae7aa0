"""The HTML report's Flight Recorder section: what PyTorch's dumps say, apart from the
logs (the same facts as the text report's FLIGHT RECORDER block and the JSON's
``flight_recorder`` object, from :func:`~ncclscope.export.json_report.flight_doc`).

Per process group: its members, whether it was joined to a communicator of the logs
(and how, or why not), and each rank's last enqueued, started and completed
collective as its dump's ``pg_status`` gives them, the ranks furthest behind marked
(``tr.behind``).
"""

from __future__ import annotations

import html
from typing import Any

from ncclscope.export.json_report import FLIGHT_JOIN_WHY
from ncclscope.units import rank_ranges

__all__ = ["FLIGHT_INTRO", "flight_body"]

FLIGHT_INTRO = (
    "From PyTorch Flight Recorder dumps, not from the logs: each rank's last collective "
    "enqueued, started and completed per process group, as the rank's dump says at the "
    "time it was written. The rank furthest behind in a group is marked."
)


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def flight_body(fr: dict[str, Any]) -> str | None:
    """The section's HTML for the JSON's ``flight_recorder`` object; None without dumps."""
    dumps = fr["dumps"]
    if not dumps:
        return None
    read = [d for d in dumps if d["problem"] is None]
    states = fr["entries_by_state"]
    formats = "/".join(sorted({d["format"] for d in read})) or "-"
    facts = [
        ("dumps read", f"{len(read)} of {len(dumps)}"),
        ("ranks", rank_ranges(fr["ranks"]) or "-"),
        ("versions", ", ".join(fr["versions"]) or "unknown"),
        (
            "entries",
            f"{fr['entries']:,} ({formats}): {states['scheduled']:,} scheduled, "
            f"{states['started']:,} started, {states['completed']:,} completed as written; "
            f"{fr['completed']:,} completed per the group status",
        ),
    ]
    parts = [f"<p>{_esc(FLIGHT_INTRO)}</p>", _facts(facts)]
    problems = [d for d in dumps if d["problem"] is not None]
    if problems:
        items = "".join(
            f"<li><code>{_esc(d['path'])}</code>: {_esc(d['problem'])}</li>" for d in problems
        )
        parts.append(f"<h3>Dumps not read</h3><ul>{items}</ul>")
    parts.extend(_group(g) for g in fr["process_groups"])
    return "".join(parts)


def _num(value: int | None) -> int:
    return -1 if value is None else value


def _facts(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="facts">{body}</table>'


def _group(g: dict[str, Any]) -> str:
    name = g["name"] + (f" ({g['desc']})" if g["desc"] else "")
    if g["ranks"]:
        members = f"{_plural(len(g['ranks']), 'rank')}: {rank_ranges(g['ranks'])}"
    else:
        seen = rank_ranges(g["ranks_with_entries"]) or "none"
        members = f"members unknown (calls from ranks {seen})"
    if g["join"] == "joined":
        join = (
            f"joined to communicator {g['comm_key']}: COLL seq = collective_seq_id "
            f"{g['seq_offset']:+d}; {g['agreed']:,} of {g['checked']:,} calls agree "
            "(op and count)"
        )
    else:
        join = f"not joined to the logs: {FLIGHT_JOIN_WHY.get(g['join'], g['join'])}"
    head = f"<h3>Process group {_esc(name)}</h3>" + _facts(
        [("members", members), ("entries", f"{g['entries']:,}"), ("logs", join)]
    )
    status = g["status"]
    if not status:
        return head + "<p>No group status in the dumps (<code>pg_status</code>).</p>"

    # Behind: the fewest collectives enqueued (a rank that never called the one the
    # others wait in), then the fewest completed.
    def progress(s: dict[str, Any]) -> tuple[int, int]:
        return (_num(s["last_enqueued"]), _num(s["last_completed"]))

    keys = {progress(s) for s in status}
    behind = min(keys) if len(keys) > 1 else None
    rows = []
    for s in status:
        cells = [s["rank"], s["last_enqueued"], s["last_started"], s["last_completed"]]
        tds = "".join(f"<td>{'-' if v is None else _esc(v)}</td>" for v in cells)
        mark = ' class="behind"' if progress(s) == behind else ""
        rows.append(f"<tr{mark}>{tds}</tr>")
    table = (
        '<table class="status"><tr><th>rank</th><th>last enqueued</th><th>last started</th>'
        f"<th>last completed</th></tr>{''.join(rows)}</table>"
    )
    return head + table
