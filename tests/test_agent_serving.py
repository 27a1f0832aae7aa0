"""Serving /metrics to many scrapers: one render per version of the board, and a
textfile that is replaced whole."""

from __future__ import annotations

from pathlib import Path

from ncclscope.agent.exporter import Board, identity_rows, render, write_textfile


class _CountingBoard(Board):
    """A board that counts its renders."""

    def __init__(self) -> None:
        super().__init__()
        self.renders = 0

    def snapshot(self) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        self.renders += 1
        return super().snapshot()


def test_render_once_per_version_of_the_board() -> None:
    board = _CountingBoard()
    board.set("identity", identity_rows("node-7"))
    first = render(board)
    assert [render(board) for _ in range(50)] == [first] * 50
    assert board.renders == 1
    board.set("host", {"ncclscope_host_memory_available_bytes": [((), 1.5e9)]})
    body = render(board)
    assert b"ncclscope_host_memory_available_bytes 1.5e+09" in body
    assert board.renders == 2
    assert render(board) == body
    assert board.renders == 2


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
