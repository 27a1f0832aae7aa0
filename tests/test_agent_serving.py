"""Serving /metrics to many scrapers: a bounded pool of handlers, a fast 503 past it
(counted), per-connection timeouts, one render per version of the board, and a
textfile that is replaced whole.

Real sockets on 127.0.0.1.  Nothing here waits for time to pass as a way to order
things: scrapes are held inside the server by an Event, and timeouts are only guards
against a hang (generous, so a loaded machine does not fail them).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ncclscope.agent.exporter import Board, MetricsServer, identity_rows, render, write_textfile
from ncclscope.agent.run import Agent, AgentConfig

#: how long anything may take before the test calls it a hang
GUARD_S = 10.0


class _GatedBoard(Board):
    """A board that counts its renders and, while ``gate`` is clear, holds every scrape
    where rendering starts (reading the version), counting the scrapes held."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.held = 0
        self.changed = threading.Condition()
        self.renders = 0

    @property
    def version(self) -> int:
        if not self.gate.is_set():
            with self.changed:
                self.held += 1
                self.changed.notify_all()
            self.gate.wait(GUARD_S)
        return super().version

    def snapshot(self) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        self.renders += 1
        return super().snapshot()

    def wait_held(self, n: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.held >= n, GUARD_S), self.held


@contextmanager
def _serving(board: Board, **options: Any) -> Iterator[MetricsServer]:
    server = MetricsServer(board, "127.0.0.1:0", **options)
    server.start()
    try:
        yield server
    finally:
        if isinstance(board, _GatedBoard):
            board.gate.set()  # else close() waits for the held handlers
        server.close()


def _send(port: int, request: bytes = b"GET /metrics HTTP/1.0\r\n\r\n") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=GUARD_S)
    sock.sendall(request)
    return sock


def _answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """The whole answer, read to the server's close: status line and headers, body."""
    chunks = []
    with sock:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return head, body


def _status(head: bytes) -> int:
    return int(head.split(b" ", 2)[1])


def _scrape(port: int) -> tuple[int, bytes]:
    head, body = _answer(_send(port))
    return _status(head), body


def test_past_every_handler_and_the_queue_a_scrape_gets_a_fast_503() -> None:
    board = _GatedBoard()
    board.set("identity", identity_rows("node-7"))
    board.gate.clear()
    with _serving(board, handlers=2, waiting=3) as server:
        port = server.address[1]
        busy = [_send(port) for _ in range(2)]
        board.wait_held(2)  # both handlers are inside a scrape
        queued = [_send(port) for _ in range(3)]  # accepted in order: the queue fills
        head, body = _answer(_send(port))
        # answered while every handler is still held: by the accepting thread, unrendered
        assert not board.gate.is_set()
        assert board.renders == 0
        assert _status(head) == 503
        assert b"Connection: close" in head
        assert b"Retry-After: 1" in head
        assert b"busy" in body
        assert server.rejected == 1
        assert server.rows() == {"ncclscope_http_requests_rejected_total": [((), 1.0)]}

        board.gate.set()
        answers = [_answer(sock) for sock in busy + queued]
        assert [_status(h) for h, _ in answers] == [200] * 5
        assert {b for _, b in answers} == {render(board)}
        assert _scrape(port)[0] == 200
        assert board.renders == 1  # seven scrapes of one version: one render
        assert server.rejected == 1


def test_a_client_that_sends_nothing_holds_a_handler_only_until_its_timeout() -> None:
    board = Board()
    board.set("identity", identity_rows("node-7"))
    with _serving(board, handlers=1, waiting=2, timeout_s=0.3) as server:
        port = server.address[1]
        stalled = socket.create_connection(("127.0.0.1", port), timeout=GUARD_S)
        with stalled:
            # The only handler takes the stalled connection first; the scrape behind it
            # is answered once the stalled one times out, and the server closed it.
            status, body = _scrape(port)
            assert status == 200
            assert b'ncclscope_node_info{hostname="node-7"} 1.0' in body
            assert stalled.recv(1024) == b""
        assert server.rejected == 0


def test_keep_alive_is_not_kept_a_connection_serves_one_request() -> None:
    board = Board()
    board.set("identity", identity_rows("node-7"))
    # A long handler timeout: only closing after the answer ends the read below in time.
    with _serving(board, handlers=1, timeout_s=60.0) as server:
        port = server.address[1]
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n"
        head, body = _answer(_send(port, request))
        assert head.startswith(b"HTTP/1.0 200")
        assert body == render(board)
        assert _scrape(port)[0] == 200  # the one handler is free again


def test_render_once_per_version_of_the_board() -> None:
    board = _GatedBoard()
    board.set("identity", identity_rows("node-7"))
    first = render(board)
    assert [render(board) for _ in range(50)] == [first] * 50
    assert board.renders == 1
    with _serving(board) as server:
        port = server.address[1]
        results: list[tuple[int, bytes]] = []
        threads = [
            threading.Thread(target=lambda: results.append(_scrape(port))) for _ in range(20)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(GUARD_S)
        assert results == [(200, first)] * 20
        assert board.renders == 1
        board.set("host", {"ncclscope_host_memory_available_bytes": [((), 1.5e9)]})
        status, body = _scrape(port)
        assert status == 200
        assert b"ncclscope_host_memory_available_bytes 1.5e+09" in body
        assert board.renders == 2
        assert render(board) == body
        assert board.renders == 2


def test_the_agent_puts_the_rejections_on_its_board() -> None:
    a = Agent(AgentConfig(listen="127.0.0.1:0", hostname="node-7"))
    a.start()
    try:
        assert a.server is not None
        a.tick()
        assert b"ncclscope_http_requests_rejected_total 0.0\n" in render(a.board)
        a.server.rejected = 3  # as three 503s would have left it
        a.tick()
        assert a.bound is not None
        status, body = _scrape(a.bound[1])
        assert status == 200
        assert b"ncclscope_http_requests_rejected_total 3.0\n" in body
    finally:
        a.finish()
        if a.server is not None:
            a.server.close()


def test_textfile_is_replaced_whole(tmp_path: Path) -> None:
    """node_exporter may read the file at any moment: it must see the old file or the
    new one, never a half-written one; so the new one is renamed over the old."""
    board = Board()
    board.set("identity", identity_rows("node-7"))
    path = tmp_path / "ncclscope.prom"
    path.write_text("# the previous exposition\n")
    with path.open() as reader:  # a reader that opened the old file...
        write_textfile(board, path)
        assert reader.read() == "# the previous exposition\n"  # ...reads it whole
    assert path.read_bytes() == render(board)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
