"""The HTML report's Flight Recorder section, on real PyTorch dumps (fixtures/flight-recorder)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ncclscope.analysis import run_analysis
from ncclscope.export.html_report import render_html

FR = Path(__file__).resolve().parent.parent / "fixtures" / "flight-recorder"


def _section(page: str) -> str | None:
    m = re.search(r'<section id="flight">(.*?)</section>', page, re.S)
    return None if m is None else m.group(1)


def _status_rows(section: str) -> list[tuple[bool, list[str]]]:
    """(marked behind, cells) per row of the status tables."""
    rows = re.findall(r"<tr( class=\"behind\")?>((?:<td>[^<]*</td>)+)</tr>", section)
    return [(bool(mark), re.findall(r"<td>([^<]*)</td>", cells)) for mark, cells in rows]


def test_the_rank_that_never_enqueued_is_marked(tmp_path: Path) -> None:
    page = render_html(run_analysis([str(FR / "hang-dump-in-flight")], workdir=tmp_path))
    section = _section(page)
    assert section is not None
    assert '<a href="#flight">' in page
    assert "not from the logs" in section
    assert "not joined to the logs: no COLL lines among the inputs" in section
    rows = _status_rows(section)
    assert [cells[0] for _m, cells in rows] == ["0", "1", "2", "3"]
    # Rank 2 never enqueued the collective the others wait in (PyTorch's own verdict).
    assert [cells[0] for marked, cells in rows if marked] == ["2"]


def test_a_healthy_run_marks_nobody(tmp_path: Path) -> None:
    section = _section(render_html(run_analysis([str(FR / "healthy")], workdir=tmp_path)))
    assert section is not None
    rows = _status_rows(section)
    assert rows
    assert not any(marked for marked, _c in rows)


def test_no_dumps_no_section(tmp_path: Path) -> None:
    log = FR / "hang-dump-in-flight" / "job.log"
    assert log.exists()
    page = render_html(run_analysis([str(log)], workdir=tmp_path))
    assert _section(page) is None
    assert '<a href="#flight">' not in page


def test_an_unreadable_dump_is_listed_escaped(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    shutil.copytree(FR / "healthy", dumps)
    bad = dumps / "nccl_trace_rank_<b>9"
    whole = (FR / "healthy" / "fr_trace_rank_0").read_bytes()
    bad.write_bytes(whole[: len(whole) // 2])  # a dump cut in half
    section = _section(render_html(run_analysis([str(dumps)], workdir=tmp_path / "w")))
    assert section is not None
    assert "Dumps not read" in section
    assert "nccl_trace_rank_&lt;b&gt;9" in section
    assert "<b>9" not in section
