"""Ask NCCL's RAS for the job's state, as ``ncclras`` does, bounded in time.

The protocol, read from NVIDIA/nccl ``src/ras/client.cc`` (the ``ncclras`` client, at
master after 2.29.7), ``src/ras/client_support.cc`` (the server side, ``rasClientEventLoop``,
at v2.24.3-1, v2.26.2-1, v2.28.7-1, v2.28.9-1 and master) and ``src/ras/ras_internal.h``:

* RAS listens on ``NCCL_RAS_ADDR`` (``host:port`` or ``[v6]:port``; default
  ``localhost:28028``) in every NCCL process of a job started with RAS on
  (``NCCL_RAS_ENABLE``, default 1, 2.24+).  Each command is one line ending in ``\\n``
  (a ``\\r`` before it is dropped), case-insensitive; each reply but the report is one line.
* ``CLIENT PROTOCOL 2`` -> ``SERVER PROTOCOL 2``.  ``NCCL_RAS_CLIENT_PROTOCOL`` is 2 in
  every release from 2.24.3 to 2.29.7; the server ignores the client's number and
  ``ncclras`` only warns on a different one and goes on.
* ``TIMEOUT <s>`` -> ``OK`` (or ``ERROR: Invalid timeout value <s>``): how long the
  server waits for the other processes' answers (default 5 s; 0: for ever).  A gathering
  ends at ``s`` when the late peers are its own direct links, else at ``s`` + 5 s (the
  "extra" timeout, both times ``NCCL_RAS_TIMEOUT_FACTOR``), ``collectives.cc``.
* ``SET FORMAT json`` / ``SET FORMAT text`` -> ``OK`` (2.28.7+); older servers answer
  ``ERROR: Unknown command SET FORMAT json`` and keep the connection.  The protocol
  number did not change with it, so the only way to learn whether a server writes JSON
  is to ask.
* ``STATUS`` or ``VERBOSE STATUS`` (more ranks named in each group) -> the report, sent in
  pieces (text: the version lines and job summary at once, then ``Communicators...``,
  the rest when the gathering ends; JSON: all at the end), after which the server
  **closes the connection**; there is no terminator.  Anything else gets
  ``ERROR: Unknown command <line>``; a line over the server's buffer closes the socket.

So a whole report is one that ended by the server's close and reads whole: JSON that
parses (2.28.7-2.28.9 drop a comma, which :func:`parse_ras_json` puts back); text that
reached its last heading (``Warnings``) and ends at a line end.  A close inside the last
section cannot be told from the end; nothing in the protocol can.

One call (``VERBOSE STATUS`` in JSON where the server writes it)::

    -> CLIENT PROTOCOL 2            <- SERVER PROTOCOL 2
    -> TIMEOUT 3                    <- OK
    -> SET FORMAT json              <- OK
    -> VERBOSE STATUS               <- {"nccl_version": "2.28.9", ...}  (then close)

The whole call is bounded by ``timeout_s`` whatever the peer does; there is no ``late``
outcome: what is still coming at the deadline is cut and kept as ``truncated``.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from ncclscope.evidence.manifest import Ask, Outcome
from ncclscope.parsers.tools.ras import parse_ras_json, parse_ras_text

__all__ = ["DEFAULT_RAS_ADDR", "RAS_PORT", "ask_ras", "ras_addr_from_env"]

RAS_PORT = 28028
DEFAULT_RAS_ADDR = f"127.0.0.1:{RAS_PORT}"
#: ``NCCL_RAS_CLIENT_PROTOCOL`` (``src/ras/ras_internal.h``), 2.24.3 to 2.29.7.
PROTOCOL = 2
#: ``RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC``: how long past TIMEOUT a gathering may still run.
_EXTRA_S = 5
#: A reply line longer than this is not the protocol (the server's own lines are short).
_LINE_MAX = 1024
#: A report larger than this is cut (a 10k-rank job's verbose JSON is a few MB).
_REPORT_MAX = 64 << 20
_ENABLE_HINT = (
    "RAS is not listening there: it needs NCCL 2.24+ in the job, NCCL_RAS_ENABLE unset or 1, "
    "and NCCL_RAS_ADDR (host:port, default localhost:28028) matching the address asked"
)


class _AskError(Exception):
    """Ends the conversation with its outcome (internal; never leaves :func:`ask_ras`)."""

    def __init__(self, outcome: Outcome, why: str) -> None:
        super().__init__(why)
        self.outcome: Outcome = outcome
        self.why = why


def ras_addr_from_env(environ: Mapping[str, str]) -> str:
    """The address RAS listens on for a job run with ``environ``.

    >>> ras_addr_from_env({"NCCL_RAS_ADDR": "10.0.0.7:29000"})
    '10.0.0.7:29000'
    >>> ras_addr_from_env({})
    '127.0.0.1:28028'
    """
    addr = environ.get("NCCL_RAS_ADDR", "").strip()
    return addr or DEFAULT_RAS_ADDR


def _split(addr: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or a bare host (port 28028) -> (host, port).

    >>> _split("[::1]:28028")
    ('::1', 28028)
    """
    host, port = addr.strip(), str(RAS_PORT)
    if host.startswith("["):
        host, _, rest = host[1:].partition("]")
        port = rest.removeprefix(":") or port
    elif host.count(":") == 1:
        host, port = host.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _AskError("error", f"{addr!r} is not a host:port address")
    return host, int(port)


def _resolve(host: str, port: int, timeout_s: float) -> list[tuple[int, tuple[str, int]]]:
    """The addresses to try, each once, like ``ncclras`` (every result of getaddrinfo).
    A name is resolved on a helper thread so that a slow resolver cannot hold the call."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, (host, port))]
    found: list[tuple[int, tuple[str, int]]] = []
    failed: list[str] = []

    def lookup() -> None:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            found.extend((fam, (str(sa[0]), int(sa[1]))) for fam, _, _, _, sa in infos)
        except OSError as e:
            failed.append(str(e))

    worker = threading.Thread(target=lookup, name="ras-resolve", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise _AskError("no_answer", f"resolving {host} took longer than {timeout_s:.1f} s")
    if not found:
        raise _AskError("error", f"cannot resolve {host}: {failed[0] if failed else 'no address'}")
    return found


def _not_protocol(after: str, reply: object) -> _AskError:
    return _AskError("garbage", f"answer to {after!r} is not RAS protocol: {reply!r:.80}")


class _Conversation:
    """One connection, every read and write held to one deadline."""

    def __init__(self, sock: socket.socket, deadline: float, budget_s: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.budget_s = budget_s
        self.pending = b""  # read past the end of the last line (the report may follow)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def send(self, line: str) -> None:
        if self.left() <= 0:
            raise self.late(line)
        self.sock.settimeout(self.left())
        try:
            self.sock.sendall(line.encode("ascii") + b"\n")
        except TimeoutError:
            raise self.late(line) from None
        except OSError as e:
            raise _AskError("error", f"RAS dropped the connection at {line!r}: {e}") from None

    def line(self, after: str) -> str:
        """The next reply line (without its newline)."""
        while b"\n" not in self.pending:
            if len(self.pending) > _LINE_MAX:
                raise _not_protocol(after, self.pending)
            chunk = self.recv(after)
            if not chunk:
                raise _AskError("no_answer", f"RAS closed without answering {after!r}")
            self.pending += chunk
        raw, _, self.pending = self.pending.partition(b"\n")
        try:
            return raw.decode("ascii").rstrip("\r")
        except UnicodeDecodeError:
            raise _not_protocol(after, raw) from None

    def recv(self, after: str) -> bytes:
        left = self.left()
        if left <= 0:
            raise self.late(after)
        self.sock.settimeout(left)
        try:
            return self.sock.recv(65536)
        except TimeoutError:
            raise self.late(after) from None

    def late(self, what: str) -> _AskError:
        return _AskError("no_answer", f"no answer to {what!r} within {self.budget_s:.1f} s")

    def report(self) -> tuple[bytes, str | None]:
        """Everything until the server closes; and why it stopped early (None: closed)."""
        data = bytearray(self.pending)
        while True:
            left = self.left()
            if left <= 0:
                if not data:
                    return b"", f"no report within {self.budget_s:.1f} s"
                return bytes(data), f"the report was still coming after {self.budget_s:.1f} s"
            if len(data) > _REPORT_MAX:
                return bytes(data[:_REPORT_MAX]), f"the report passed {_REPORT_MAX >> 20} MiB"
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue  # the deadline check above ends it
            except OSError as e:  # reset by the peer mid-report
                return bytes(data), f"the connection broke ({e})"
            if not chunk:
                return bytes(data), None
            data += chunk


def ask_ras(
    folder: Path,
    *,
    addr: str = DEFAULT_RAS_ADDR,
    fmt: Literal["auto", "json", "text"] = "auto",
    timeout_s: float = 5.0,
    verbose: bool = True,
) -> Ask:
    """Ask RAS at ``addr`` for its report and keep it in ``folder/ras/``.

    ``fmt="auto"`` asks for JSON and takes text from a server older than 2.28.7;
    ``"json"`` takes JSON or nothing (``refused``); ``"text"`` asks for text.  Returns what
    came of it; never raises for what the peer did.  A sample result::

        Ask(what="ras", target="RAS 127.0.0.1:28028", via="ncclras protocol 2",
            outcome="answered", file="ras/report.json", elapsed_s=0.012, size_bytes=2231)
    """
    start = time.monotonic()
    deadline = start + timeout_s
    ask = Ask(what="ras", target=f"RAS {addr}", via=f"ncclras protocol {PROTOCOL}",
              outcome="error")  # fmt: skip
    sock: socket.socket | None = None
    try:
        host, port = _split(addr)
        sock = _connect(host, port, deadline, timeout_s)
        talk = _Conversation(sock, deadline, timeout_s)
        protocol = _handshake(talk)
        ask.via = f"ncclras protocol {protocol}"
        json_fmt = _choose_format(talk, fmt)
        command = "VERBOSE STATUS" if verbose else "STATUS"
        talk.send(command)
        data, cut = talk.report()
        _judge(ask, folder, data, cut, json_fmt=json_fmt)
    except _AskError as stop:
        ask.outcome, ask.why = stop.outcome, stop.why
    except OSError as e:  # the folder cannot be written, or the socket failed oddly
        ask.outcome, ask.why = "error", f"{type(e).__name__}: {e}"
    finally:
        if sock is not None:
            sock.close()
        ask.elapsed_s = round(time.monotonic() - start, 3)
    return ask


def _connect(host: str, port: int, deadline: float, budget_s: float) -> socket.socket:
    refused: list[str] = []
    for family, sockaddr in _resolve(host, port, max(0.0, deadline - time.monotonic())):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(left)
        try:
            sock.connect(sockaddr)
        except ConnectionRefusedError:
            refused.append(sockaddr[0])
            sock.close()
            continue
        except TimeoutError:
            sock.close()
            raise _AskError("no_answer", f"connecting took longer than {budget_s:.1f} s") from None
        except OSError:
            sock.close()
            raise
        return sock
    if refused:
        raise _AskError("unavailable", f"connection refused on {', '.join(refused)} port {port}: "
                    f"{_ENABLE_HINT}")  # fmt: skip
    raise _AskError("no_answer", f"connecting took longer than {budget_s:.1f} s")


def _handshake(talk: _Conversation) -> int:
    """Exchange protocol versions and set the server's own wait; the server's version."""
    hello = f"CLIENT PROTOCOL {PROTOCOL}"
    talk.send(hello)
    reply = talk.line(hello)
    number = reply[len("SERVER PROTOCOL ") :].strip()
    if not reply.upper().startswith("SERVER PROTOCOL ") or not number.isdigit():
        raise _not_protocol(hello, reply)
    # The server's gathering must end before ours: it may run TIMEOUT s, or TIMEOUT + 5 s
    # when the late peers are beyond its own links; leave the 5 s where the budget allows,
    # and 1 s to send the report.  TIMEOUT takes whole seconds, and 0 would mean for ever.
    left = talk.left()
    wait = max(1, int(left - 1 - (_EXTRA_S if left >= 2 * _EXTRA_S + 2 else 0)))
    _expect_ok(talk, f"TIMEOUT {wait}")
    return int(number)


def _expect_ok(talk: _Conversation, command: str) -> None:
    talk.send(command)
    reply = talk.line(command)
    if reply.upper().startswith("ERROR"):
        raise _AskError("error", f"RAS answered {command!r} with {reply[:200]!r}")
    if reply.upper() != "OK":
        raise _not_protocol(command, reply)


def _choose_format(talk: _Conversation, fmt: str) -> bool:
    """Whether the report will be JSON: ``SET FORMAT json`` where asked and known."""
    if fmt == "text":
        return False  # the server's default; no command, as ncclras without -f
    command = "SET FORMAT json"
    talk.send(command)
    reply = talk.line(command)
    if reply.upper() == "OK":
        return True
    if not reply.upper().startswith("ERROR"):
        raise _not_protocol(command, reply)
    if fmt == "json":
        raise _AskError("refused", f"RAS does not write JSON (NCCL before 2.28.7 answers "
                    f"{command!r} with {reply[:80]!r}); ask for text or auto")  # fmt: skip
    return False


def _judge(ask: Ask, folder: Path, data: bytes, cut: str | None, *, json_fmt: bool) -> None:
    """Set the outcome from what came, and keep it."""
    if not data.strip():
        ask.outcome = "no_answer"
        ask.why = cut or "RAS closed the connection without a report"
        return
    text = data.decode("utf-8", errors="replace")
    if text.upper().startswith("ERROR"):
        ask.outcome, ask.why = "error", f"RAS answered with {text.splitlines()[0][:200]!r}"
        return
    name = "report.json" if json_fmt else "report.txt"
    # How every report of that format begins (jsonWriteHeader; rasClientRunInit), or a
    # start of that cut short (one byte a second for the whole budget).
    head = '{\n  "nccl_version": "' if json_fmt else "NCCL version "
    looks_like = text.startswith(head) or head.startswith(text)
    if json_fmt:
        # A document that parses is whole even if the close did not come in time.
        problem = parse_ras_json(text, name).problem
        whole = problem is None
        cut = None if whole else cut
    else:
        problem = parse_ras_text(text, name).problem
        # The last heading rasClientRunComms always writes; the report is cut before it.
        whole = problem is None and "\nWarnings\n" in text and text.endswith("\n")
    if problem is not None and not looks_like:
        name = "answer.raw"  # kept for a person, under a name no report reader takes
        outcome: Outcome = "garbage"
        why = problem if "not a RAS report" in problem else f"not a RAS report: {problem}"
    elif cut is not None or not whole:
        outcome = "truncated"
        why = f"{cut or 'RAS closed the connection mid-report'}; the part that came is kept"
    else:
        outcome, why = "answered", ""
    path = folder / "ras" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    ask.outcome, ask.why, ask.file, ask.size_bytes = outcome, why, f"ras/{name}", len(data)
