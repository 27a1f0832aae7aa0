"""What the line handlers read and write of a file's parser state (``lines._Parser``).

``families`` and ``blocks`` take the parser as this Protocol, so that they need not
import ``lines``, which dispatches to them: the imports run one way.
"""

from __future__ import annotations

from typing import Protocol

from ncclscope.parsers.deepspeed.records import Row, _Block, _Outcome, _Verdict
from ncclscope.parsers.deepspeed.zero import ZeroFields

__all__ = ["_ParserState"]


class _ParserState(Protocol):
    """A file's parser: rows so far, the open block, counters."""

    file_id: int
    timers: list[Row]
    throughput: list[Row]
    memory: list[list[object]]
    comms: list[Row]
    zero: dict[str, ZeroFields]
    version: str | None
    world_launcher: int | None
    trace_cache: int
    parsed: int
    step: int | None
    step_marks: list[tuple[int, int]]
    block: _Block | None
    dumps: int
    label: tuple[int, str] | None
    open_mem: tuple[int, int] | None
    model_elems: tuple[int, int] | None
    train_dtype: str | None

    def count(self, outcome: _Outcome, line_no: int, lines: int) -> None: ...

    def open_block(self, block: _Block) -> None: ...

    def start_json(self, block: _Block, line_no: int, rest: str) -> None: ...

    def finish_json(self, block: _Block) -> None: ...

    def store_config(self, key: str, value: str) -> None: ...

    def miss(self, block: _Block) -> _Verdict: ...

    def zero3_seen(self) -> None: ...
