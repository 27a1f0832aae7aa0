"""Readers of what NCCL's own tools write beside the logs: NCCL Inspector records,
RAS reports (``ncclras``) and nccl-tests output.  Each is found by content
(:func:`sniff_tool`), never by name, and read into declared tables (``schema.py``);
a bad record or line is counted with its reason and skipped, never raised.
"""

from __future__ import annotations

import re

__all__ = ["TOOL_KINDS", "sniff_tool"]

#: Input kinds (``sources.Input.kind``) of the tools' outputs.  ``nccl_tests`` is also
#: scanned as a log: nccl-tests run with ``NCCL_DEBUG=INFO`` prints NCCL's lines too.
TOOL_KINDS = ("inspector", "ras_text", "ras_json", "nccl_tests")


_FIRST_KEY_INSPECTOR = re.compile(rb'\{\s*"header"\s*:\s*\{')
_FIRST_KEY_RAS = re.compile(rb'\{\s*"nccl_version"\s*:')
#: ``Job summary`` underlined, or ``Communicators...`` after ``NCCL version``, each line
#: possibly behind a launcher's prefix (``0: ``, ``[1,0]<stdout>:``).
_RAS_TEXT = re.compile(
    rb"Job summary\r?\n[^\n]{0,60}?={5}|NCCL version [^\n]*\r?\n(?:[^\n]*\n){0,80}?[^\n]{0,60}?"
    rb"Communicators\.\.\."
)
#: The table head or the footer lines of nccl-tests (a paste that starts at the table).
_NCCL_TESTS_TEXT = re.compile(
    rb"size\s+count\s+type\s[^\n]*busbw|Avg bus bandwidth\s*:|Out of bounds values\s*:"
)
_FIRST_KEY_NCCL_TESTS = re.compile(rb'\{\s*"version"\s*:\s*\d+\s*,\s*"start_time"\s*:')


def sniff_tool(head: bytes) -> str | None:
    """The input kind of a file whose first bytes are ``head``, or None.

    - ``inspector``: a JSON object per line with ``header`` and ``coll_perf`` (the
      plugin writes ``{"header":{"id":...},"metadata":{...},"coll_perf":{...}}``);
    - ``ras_json``: ``ncclras -f json``: an object with ``nccl_version`` and
      ``communicators``;
    - ``ras_text``: the text report: ``Job summary`` underlined, or ``Communicators...``
      after an ``NCCL version`` line;
      ``ncclras``'s own connection failure is ``ras_text`` too (read as a problem);
    - ``nccl_tests``: nccl-tests' ``-J`` JSON file (``{"version": 3, "start_time"``), an
      ``*_perf`` header (``# nThread 1 nGpus 1 minBytes ...``), the
      ``# nccl-tests version`` line, or the out-of-place/in-place table head.
    """
    text = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    if text[:3] == b"OK\n" or text[:4] == b"OK\r\n":  # RAS's ack of ``SET FORMAT json`` (nc)
        text = text[2:].lstrip(b" \t\r\n")
    if text[:1] == b"{":
        # The writers' first keys: Inspector's ``header``, RAS's ``nccl_version``; a JSON
        # document that merely mentions them (ncclscope's own report) is not taken.
        if _FIRST_KEY_INSPECTOR.match(text) and b'"coll_perf"' in text:
            return "inspector"
        if _FIRST_KEY_RAS.match(text) and b'"communicators' in text:
            return "ras_json"
        if _FIRST_KEY_NCCL_TESTS.match(text):
            return "nccl_tests"  # nccl-tests' ``-J`` file (2.17+)
        return None
    if _RAS_TEXT.search(text):
        return "ras_text"
    if b"Failed to connect to the NCCL RAS service" in text:
        return "ras_text"  # ncclras could not reach the job: read as a problem
    if (
        b"# nccl-tests version" in text
        or (b"nThread " in text and b" nGpus " in text and b"minBytes " in text)
        or (b"out-of-place" in text and b"in-place" in text and b"busbw" in text)
        or _NCCL_TESTS_TEXT.search(text)
    ):
        return "nccl_tests"
    return None
