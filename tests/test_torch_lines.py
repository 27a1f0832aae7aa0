"""Tests of the PyTorch-distributed line parser (``ncclscope.parsers.torch.lines``).

Every sample line is written here in the real formats (grammar:
``shared/formats/deepspeed-torch.md`` PART T) with invented hosts, pids and counters.
"""

from __future__ import annotations

import doctest
import time
from datetime import UTC, datetime

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncclscope.parsers.torch import lines as torch_lines
from ncclscope.parsers.torch.lines import (
    BLOCK_LINES,
    BLOCK_STARTS,
    CANDIDATES,
    TorchResult,
    parse_torch,
)
from ncclscope.schema import FAILURES_SCHEMA, TIMEOUTS_SCHEMA, TORCH_EVENTS_SCHEMA

FILE_ID = 7


def parse(lines: list[str], *, year: int | None = 2024, start: int = 1) -> TorchResult:
    return parse_torch(list(enumerate(lines, start)), file_id=FILE_ID, year=year)


def dt(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, sec, us, tzinfo=UTC)


def rows(df: pl.DataFrame, *cols: str) -> list[tuple[object, ...]]:
    return df.select(cols).rows()


TIMEOUT_COLS = (
    "line_no",
    "host",
    "global_rank",
    "rank",
    "pg",
    "pg_desc",
    "seq",
    "op",
    "numel_in",
    "numel_out",
    "timeout_s",
    "ran_for_s",
    "last_enqueued",
    "last_completed",
    "ts",
    "ts_source",
)
EVENT_COLS = (
    "line_no",
    "host",
    "global_rank",
    "rank",
    "pg",
    "kind",
    "seq",
    "op",
    "ranks",
    "value",
    "message",
    "ts",
    "ts_source",
)
FAILURE_COLS = (
    "line_no",
    "host",
    "rank",
    "local_rank",
    "pid",
    "exitcode",
    "signal",
    "root_cause",
    "source",
    "ts",
    "ts_source",
)

WD = "Watchdog caught collective operation timeout: "


def wd(fields: str, ran: int, rank: int | None = None) -> str:
    """A watchdog message: ``[Rank r] Watchdog caught ... WorkNCCL(fields) ran for ...``."""
    head = f"[Rank {rank}] " if rank is not None else ""
    return f"{head}{WD}WorkNCCL({fields}) ran for {ran} milliseconds before timing out."


# --------------------------------------------------------------------------------------
# Watchdog timeouts, every era

WATCHDOG_ERAS = [
    pytest.param(
        "[E ProcessGroupNCCL.cpp:587] "
        + wd("OpType=ALLREDUCE, Timeout(ms)=1800000", 1808699, rank=0),
        (None, None, 0, None, None, None, "ALLREDUCE", None, None, 1800.0, 1808.699, None, "none"),
        id="1.8-no-seqnum",
    ),
    pytest.param(
        "[E ProcessGroupNCCL.cpp:737] "
        + wd("SeqNum=2917, OpType=BROADCAST, Timeout(ms)=3600000", 3600456, rank=4),
        (None, None, 4, None, None, 2917, "BROADCAST", None, None, 3600.0, 3600.456, None, "none"),
        id="1.13",
    ),
    pytest.param(
        "[E ProcessGroupNCCL.cpp:475] "
        + wd(
            "SeqNum=8812, OpType=_ALLGATHER_BASE, NumelIn=5242880, NumelOut=83886080, "
            "Timeout(ms)=1800000",
            1800512,
            rank=2,
        ),
        (
            None,
            None,
            2,
            None,
            None,
            8812,
            "_ALLGATHER_BASE",
            5242880,
            83886080,
            1800.0,
            1800.512,
            None,
            "none",
        ),
        id="2.1-numel",
    ),
    pytest.param(
        "[rank1]:[E ProcessGroupNCCL.cpp:523] "
        + wd("SeqNum=431, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000", 600041, 1),
        (None, 1, 1, None, None, 431, "ALLREDUCE", 1, 1, 600.0, 600.041, None, "none"),
        id="2.2-rank-prefix",
    ),
    pytest.param(
        "[rank5]:[E ProcessGroupNCCL.cpp:563] [PG 3 Rank 1] "
        + wd(
            "SeqNum=77, OpType=REDUCE_SCATTER, NumelIn=64, NumelOut=8, Timeout(ms)=600000", 600100
        ),
        (None, 5, 1, "3", None, 77, "REDUCE_SCATTER", 64, 8, 600.0, 600.1, None, "none"),
        id="2.3-pg-prefix",
    ),
    pytest.param(
        "[rank6]:[E1108 03:12:48.117804 4411 ProcessGroupNCCL.cpp:632] [PG 0 (default_pg) Rank 6] "
        + wd("SeqNum=57, OpType=ALLREDUCE, NumelIn=2, NumelOut=2, Timeout(ms)=600000", 600113, 6),
        (
            None,
            6,
            6,
            "0",
            "default_pg",
            57,
            "ALLREDUCE",
            2,
            2,
            600.0,
            600.113,
            dt(2024, 11, 8, 3, 12, 48, 117804),
            "logger_no_year",
        ),
        id="2.4-glog-time",
    ),
    pytest.param(
        "[rank3]:[E714 22:01:09.381522 1187 ProcessGroupNCCL.cpp:616] "
        "[PG ID 1 PG GUID 5(tp_group) Rank 3] "
        + wd(
            "SeqNum=9, OpType=_REDUCE_SCATTER_BASE, NumelIn=8, NumelOut=1, Timeout(ms)=60000", 60017
        ),
        (
            None,
            3,
            3,
            "5",
            "tp_group",
            9,
            "_REDUCE_SCATTER_BASE",
            8,
            1,
            60.0,
            60.017,
            dt(2024, 7, 14, 22, 1, 9, 381522),
            "logger_no_year",
        ),
        id="2.5-pg-guid",
    ),
]


WATCHDOG_LINES: list[str] = [str(p.values[0]) for p in WATCHDOG_ERAS]


@pytest.mark.parametrize(("line", "expected"), WATCHDOG_ERAS)
def test_watchdog_eras(line: str, expected: tuple[object, ...]) -> None:
    res = parse([line])
    era_cols = [c for c in TIMEOUT_COLS[1:] if not c.startswith("last_")]
    assert rows(res.timeouts, *era_cols) == [expected]
    assert rows(res.timeouts, "last_enqueued", "last_completed") == [(None, None)]
    assert res.timeouts["line_no"].to_list() == [1]
    assert res.timeouts["file_id"].to_list() == [FILE_ID]
    assert (res.parsed, res.malformed, res.first_malformed, res.seen) == (1, 0, None, True)


def test_frames_have_their_schemas_even_when_empty() -> None:
    res = parse(["epoch 3 loss 2.31"])
    assert res.timeouts.schema == TIMEOUTS_SCHEMA
    assert res.failures.schema == FAILURES_SCHEMA
    assert res.events.schema == TORCH_EVENTS_SCHEMA
    assert (res.timeouts.height, res.failures.height, res.events.height) == (0, 0, 0)
    assert (res.seen, res.parsed, res.malformed, res.first_malformed, res.version) == (
        False,
        0,
        0,
        None,
        None,
    )


def test_full_frame_of_one_timeout() -> None:
    res = parse([WATCHDOG_LINES[5]])
    assert res.timeouts.to_dicts() == [
        {
            "file_id": FILE_ID,
            "line_no": 1,
            "host": None,
            "global_rank": 6,
            "rank": 6,
            "pg": "0",
            "pg_desc": "default_pg",
            "seq": 57,
            "op": "ALLREDUCE",
            "numel_in": 2,
            "numel_out": 2,
            "timeout_s": 600.0,
            "ran_for_s": 600.113,
            "last_enqueued": None,
            "last_completed": None,
            "ts": dt(2024, 11, 8, 3, 12, 48, 117804),
            "ts_source": "logger_no_year",
        }
    ]


@pytest.mark.parametrize(
    ("mmdd", "year", "ts", "source"),
    [
        ("714", 2023, dt(2023, 7, 14, 23, 59, 58, 500000), "logger_no_year"),  # July 14
        ("1108", 2023, dt(2023, 11, 8, 23, 59, 58, 500000), "logger_no_year"),  # Nov 8
        ("0305", 2023, dt(2023, 3, 5, 23, 59, 58, 500000), "logger_no_year"),  # padded
        ("714", None, None, "none"),  # no year: no time, and the source says so
        ("230", 2024, None, "none"),  # digits in place, no such day
    ],
)
def test_glog_month_is_not_zero_padded_and_needs_a_year(
    mmdd: str, year: int | None, ts: datetime | None, source: str
) -> None:
    line = f"[rank0]:[E{mmdd} 23:59:58.5 77 ProcessGroupNCCL.cpp:616] " + wd(
        "SeqNum=1, OpType=BARRIER, NumelIn=1, NumelOut=1, Timeout(ms)=1000", 1001, 0
    )
    assert rows(parse([line], year=year).timeouts, "ts", "ts_source") == [(ts, source)]


def test_numel_sentinel_is_null() -> None:
    res = parse(
        [
            "[rank2]:[E ProcessGroupNCCL.cpp:563] [PG 0 Rank 2] "
            + wd(
                "SeqNum=12, OpType=COALESCED, NumelIn=18446744073709551615, "
                "NumelOut=18446744073709551615, Timeout(ms)=600000",
                600020,
            )
        ]
    )
    assert rows(res.timeouts, "seq", "op", "numel_in", "numel_out") == [
        (12, "COALESCED", None, None)
    ]


# --------------------------------------------------------------------------------------
# Prefixes in combination, and noise in front


PREFIXED = [
    pytest.param(
        "(RayTrainWorker pid=4242, ip=10.0.3.17) [rank9]:[E ProcessGroupNCCL.cpp:523] ",
        ("10.0.3.17", 9),
        id="ray",
    ),
    pytest.param(
        "\x1b[36m(RayTrainWorker pid=4242, ip=10.0.3.17)\x1b[0m "
        "[rank9]:[E ProcessGroupNCCL.cpp:523] ",
        ("10.0.3.17", 9),
        id="ray-ansi",
    ),
    pytest.param(
        "gpu-node-07: [rank9]:[E ProcessGroupNCCL.cpp:523] ", ("gpu-node-07", 9), id="pdsh"
    ),
    pytest.param("10.20.30.41: [rank9]:[E ProcessGroupNCCL.cpp:523] ", ("10.20.30.41", 9), id="ip"),
    pytest.param("3: [rank9]:[E ProcessGroupNCCL.cpp:523] ", (None, 9), id="srun-l"),
    pytest.param(
        "gpu-node-07: [default1]:[rank9]:[E ProcessGroupNCCL.cpp:523] ",
        ("gpu-node-07", 9),
        id="pdsh-tee-rank",
    ),
    pytest.param(
        "(TorchTrainer pid=17) dgx-a12: [default1]:[rank9]:[E ProcessGroupNCCL.cpp:523] ",
        ("dgx-a12", 9),
        id="ray-pdsh-tee-rank",
    ),
    pytest.param(
        " 97%|#########7| 581/596 [14:02<00:21,  1.45s/it]\r[rank9]:[E ProcessGroupNCCL.cpp:523] ",
        (None, 9),
        id="tqdm-cr",
    ),
    pytest.param("\x1b[31m[rank9]:\x1b[0m[E ProcessGroupNCCL.cpp:523] ", (None, 9), id="ansi"),
    pytest.param("[default1]:\x00\x00[rank9]:[E ProcessGroupNCCL.cpp:523] ", (None, 9), id="nul"),
]


@pytest.mark.parametrize(("prefix", "expected"), PREFIXED)
def test_prefixes_in_combination(prefix: str, expected: tuple[object, ...]) -> None:
    msg = wd("SeqNum=5, OpType=ALLGATHER, NumelIn=3, NumelOut=24, Timeout(ms)=600000", 600002, 1)
    res = parse([prefix + msg])
    assert rows(res.timeouts, "host", "global_rank", "rank", "seq", "op") == [
        (*expected, 1, 5, "ALLGATHER")
    ]


def test_progress_bar_redrawn_after_the_message_does_not_hide_it() -> None:
    line = (
        "[rank0]:[E ProcessGroupNCCL.cpp:523] "
        + wd("SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000", 600002, 0)
        + "\r  3%|3         | 18/596 [00:41<22:04,  2.29s/it]"
    )
    assert rows(parse([line]).timeouts, "seq") == [(5,)]


def test_replacement_characters_and_controls_around_a_message() -> None:
    line = "\ufffd\ufffd\x07[rank2]:[E ProcessGroupNCCL.cpp:523] " + wd(
        "SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000", 600002, 2
    )
    # the junk in front is no known prefix, but the message is still found
    assert rows(parse([line]).timeouts, "global_rank", "rank", "seq") == [(None, 2, 5)]


def test_exception_name_is_not_taken_for_a_pdsh_host() -> None:
    line = "torch.distributed.DistBackendError: " + wd(
        "SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000", 600002, 2
    )
    assert rows(parse([line]).timeouts, "host", "rank", "seq") == [(None, 2, 5)]
    line = "RuntimeError: " + wd("SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000", 600002, 2)
    assert rows(parse([line]).timeouts, "host", "rank", "seq") == [(None, 2, 5)]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("[Rank 4] ", (None, None, 4)),  # <= 2.2
        ("[PG 1 Rank 2] ", ("1", None, 2)),  # 2.3
        ("[PG 0 (default_pg) Rank 6] ", ("0", "default_pg", 6)),  # 2.4
        ("[PG ID 0 PG GUID 0(default_pg) Rank 3] ", ("0", "default_pg", 3)),  # 2.5+
        ("[PG ID 1 PG GUID 7 Rank 3] ", ("7", None, 3)),  # 2.5+, no description
    ],
)
def test_pg_prefix_generations(prefix: str, expected: tuple[object, ...]) -> None:
    res = parse(
        [
            "[rank11]:[E ProcessGroupNCCL.cpp:2168] "
            + prefix
            + "Timeout at NCCL work: 9, last enqueued NCCL work: 10, last completed NCCL work: 8."
        ]
    )
    assert rows(res.timeouts, "pg", "pg_desc", "rank") == [expected]
    assert rows(res.events, "global_rank", "pg", "rank", "kind") == [
        (11, expected[0], expected[2], "work_status")
    ]


# --------------------------------------------------------------------------------------
# One row per work; companion lines


def test_repeated_work_lines_give_one_row() -> None:
    msg = wd("SeqNum=57, OpType=ALLREDUCE, NumelIn=2, NumelOut=2, Timeout(ms)=600000", 600113, 6)
    lines = [
        "[rank6]:[E1108 03:12:48.117804 4411 ProcessGroupNCCL.cpp:632] " + msg,
        "[rank6]:[E1108 03:12:48.118100 4411 ProcessGroupNCCL.cpp:1664] [PG 2 Rank 6] "
        "Process group watchdog thread terminated with exception: " + msg,
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        "  what():  " + msg,
        "[rank6]: torch.distributed.DistBackendError: " + msg,
    ]
    res = parse(lines)
    assert rows(res.timeouts, "line_no", "global_rank", "rank", "pg", "seq", "op", "ts") == [
        (1, 6, 6, "2", 57, "ALLREDUCE", dt(2024, 11, 8, 3, 12, 48, 117804))
    ]
    assert rows(res.events, "line_no", "kind", "rank", "pg", "seq", "op") == [
        (2, "watchdog_terminated", 6, "2", 57, "ALLREDUCE")
    ]
    assert res.events["message"][0] == msg
    assert res.parsed == 4  # "terminate called" is no record


def test_distinct_works_and_ranks_are_kept_apart() -> None:
    a = wd("SeqNum=57, OpType=ALLREDUCE, Timeout(ms)=600000", 600113, 6)
    b = wd("SeqNum=58, OpType=ALLREDUCE, Timeout(ms)=600000", 600005, 6)
    res = parse(
        [
            "[rank6]:[E ProcessGroupNCCL.cpp:632] " + a,
            "[rank7]:[E ProcessGroupNCCL.cpp:632] " + a.replace("[Rank 6]", "[Rank 7]"),
            "[rank6]:[E ProcessGroupNCCL.cpp:632] " + b,
            "node-b: [rank6]:[E ProcessGroupNCCL.cpp:632] " + a,
        ]
    )
    assert rows(res.timeouts, "line_no", "host", "global_rank", "rank", "seq") == [
        (1, None, 6, 6, 57),
        (2, None, 7, 7, 57),
        (3, None, 6, 6, 58),
        (4, "node-b", 6, 6, 57),
    ]


def test_companion_lines_fill_the_timeout_row() -> None:
    lines = [
        # 2.4: the watchdog line carries WorkNCCL's [Rank r] only; the companion the PG
        "[rank2]:[E1108 03:12:48.117 4411 ProcessGroupNCCL.cpp:632] "
        + wd("SeqNum=2641, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000", 600010, 2),
        "[rank2]:[E1108 03:12:48.118 4411 ProcessGroupNCCL.cpp:2168] [PG 1 Rank 2] Exception "
        "(either an error or timeout) detected by watchdog at work: 2641, last enqueued NCCL "
        "work: 2643, last completed NCCL work: 2640.",
        # >= 2.7: two spaces after the prefix, other wording
        "[rank3]:[E0312 10:00:00.000 99 ProcessGroupNCCL.cpp:1930] "
        "[PG ID 0 PG GUID 0(default_pg) Rank 3]  failure detected by watchdog at work sequence "
        "id: 48213 PG status: last enqueued work: 48215, last completed work: 48212",
        "[rank3]:[E0312 10:00:00.001 99 ProcessGroupNCCL.cpp:632] [Rank 3] "
        + WD
        + "WorkNCCL(SeqNum=48213, OpType=_ALLGATHER_BASE, NumelIn=4, NumelOut=64, "
        "Timeout(ms)=1800000) ran for 1800071 milliseconds before timing out.",
    ]
    res = parse(lines)
    assert rows(
        res.timeouts, "line_no", "rank", "pg", "pg_desc", "seq", "last_enqueued", "last_completed"
    ) == [(1, 2, "1", None, 2641, 2643, 2640), (4, 3, "0", "default_pg", 48213, 48215, 48212)]
    assert rows(res.events, "line_no", "global_rank", "rank", "pg", "kind", "seq", "value") == [
        (2, 2, 2, "1", "work_status", 2641, 2640),
        (3, 3, 3, "0", "work_status", 48213, 48212),
    ]
    assert res.events["message"].to_list() == [
        "exception_detected last_enqueued=2643",
        "failure_detected last_enqueued=48215",
    ]


def test_companion_with_another_counter_fills_the_nearest_timeout() -> None:
    # an observed 2.8 nightly printed PG-status counters unlike the SeqNum
    lines = [
        "[rank1]:[E0312 10:00:00.000 99 ProcessGroupNCCL.cpp:632] "
        + wd("SeqNum=301, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000", 600001, 1),
        "[rank1]:[E0312 10:00:00.001 99 ProcessGroupNCCL.cpp:1930] [PG ID 0 PG GUID 0(default_pg)"
        " Rank 1]  failure detected by watchdog at work sequence id: 150 PG status: last "
        "enqueued work: 151, last completed work: -1",
    ]
    res = parse(lines)
    assert rows(res.timeouts, "seq", "pg", "last_enqueued", "last_completed") == [
        (301, "0", 151, -1)
    ]


def test_lone_timeout_at_gives_a_row() -> None:
    lines = [
        "node-4: [rank6]:[E1108 03:12:48.118 4411 ProcessGroupNCCL.cpp:1664] "
        "[PG 0 (default_pg) Rank 6] Timeout at NCCL work: 57, last enqueued NCCL work: 58, "
        "last completed NCCL work: 56.",
    ]
    res = parse(lines)
    assert rows(res.timeouts, *TIMEOUT_COLS) == [
        (
            1,
            "node-4",
            6,
            6,
            "0",
            "default_pg",
            57,
            None,
            None,
            None,
            None,
            None,
            58,
            56,
            dt(2024, 11, 8, 3, 12, 48, 118000),
            "logger_no_year",
        )
    ]
    assert rows(res.events, "kind", "seq", "value", "message") == [
        ("work_status", 57, 56, "timeout_at last_enqueued=58")
    ]


def test_timeout_at_after_the_watchdog_line_fills_it() -> None:
    lines = [
        "[rank6]:[E1108 03:12:48.117 4411 ProcessGroupNCCL.cpp:632] "
        + wd("SeqNum=57, OpType=ALLREDUCE, NumelIn=2, NumelOut=2, Timeout(ms)=600000", 600113, 6),
        "[rank6]:[E1108 03:12:48.118 4411 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 6] "
        "Timeout at NCCL work: 57, last enqueued NCCL work: 58, last completed NCCL work: 56.",
    ]
    assert rows(parse(lines).timeouts, "seq", "op", "pg", "last_enqueued", "last_completed") == [
        (57, "ALLREDUCE", "0", 58, 56)
    ]


# --------------------------------------------------------------------------------------
# Events


def test_heartbeat_and_stuck_watchdog() -> None:
    lines = [
        "[rank3]:[E1108 03:20:48.117 4420 ProcessGroupNCCL.cpp:1375] [PG 0 Rank 3] Heartbeat "
        "monitor timed out! Process will be terminated after dumping debug info. "
        "workMetaList_.size()=57",
        "[rank3]:[F1108 03:22:48.117 4420 ProcessGroupNCCL.cpp:1172] [PG 0 Rank 3] [PG 0 Rank 3] "
        "ProcessGroupNCCL's watchdog got stuck for 600 seconds without making progress in "
        "monitoring enqueued collectives. This typically indicates a NCCL/CUDA API hang blocking "
        "the watchdog. workMetaList_.size() = 57",
    ]
    res = parse(lines)
    assert rows(res.events, "line_no", "global_rank", "rank", "pg", "kind", "value", "ts") == [
        (1, 3, 3, "0", "heartbeat_timeout", 57, dt(2024, 11, 8, 3, 20, 48, 117000)),
        (2, 3, 3, "0", "watchdog_stuck", 600, dt(2024, 11, 8, 3, 22, 48, 117000)),
    ]
    assert res.events["message"][0] == (
        "Heartbeat monitor timed out! Process will be terminated after dumping debug info. "
        "workMetaList_.size()=57"
    )


DESYNC_LAGGING = [
    "[rank2]:[E207 11:45:03.552 9931 ProcessGroupNCCL.cpp:1942] [PG 0 Rank 2] ",
    "\t - [2] Timeout at collective: ALLREDUCE, #642",
    "\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:",
    "\t   - [5] joined but didn't finish collective #641 (count from 1)",
    "\t     [0, 1, 3] finished collective #641, but didn't join collective #642 (count from 1)",
    "\t - Snapshot of ranks' latest states:",
    "\t   #641 started ranks:",
    "\t     [5] started ALLREDUCE",
    "\t   #641 finished ranks:",
    "\t     [0, 1, 3] finished ALLREDUCE",
]


@pytest.mark.parametrize(
    "head",
    [
        DESYNC_LAGGING[0],
        "[rank2]:[E207 11:45:03.552 9931 ProcessGroupNCCL.cpp:1942] Rank 2",
    ],
    ids=["pg-prefix", "bare-rank"],
)
def test_desync_report_lagging_ranks(head: str) -> None:
    res = parse([head, *DESYNC_LAGGING[1:]])
    pg = "0" if "PG" in head else None  # the lines take what the header line says
    ts = dt(2024, 2, 7, 11, 45, 3, 552000)
    timeout = "- [2] Timeout at collective: ALLREDUCE, #642"
    assert rows(res.events, *EVENT_COLS) == [
        (2, None, 2, 2, pg, "desync_timeout", 642, "ALLREDUCE", None, None, timeout, ts,
         "logger_no_year"),
        (4, None, 2, 2, pg, "desync_lagging", 641, None, [5], None, "joined_not_finished", ts,
         "logger_no_year"),
        (5, None, 2, 2, pg, "desync_lagging", 642, None, [0, 1, 3], None, "finished_not_joined",
         ts, "logger_no_year"),
    ]  # fmt: skip
    assert res.parsed == 4  # the header line and the three lines that say something


def test_desync_report_never_joined_and_per_line_prefixes() -> None:
    lines = [
        "gpu-node-2: [E ProcessGroupNCCL.cpp:1025] ",
        "gpu-node-2: \t - [3] Timeout at collective: BROADCAST, #12",
        "gpu-node-2: \t - To our best knowledge, ranks [4, 7] are the lagging ranks that caused "
        "this timeout. They never joined any collectives",
    ]
    res = parse(lines)
    assert rows(res.events, "line_no", "host", "rank", "kind", "seq", "op", "ranks", "message") == [
        (2, "gpu-node-2", 3, "desync_timeout", 12, "BROADCAST", None,
         "- [3] Timeout at collective: BROADCAST, #12"),
        (3, "gpu-node-2", 3, "desync_lagging", None, None, [4, 7], "never_joined"),
    ]  # fmt: skip


def test_desync_lines_do_not_inherit_across_a_gap() -> None:
    lines = list(enumerate(DESYNC_LAGGING[:2], 1))
    lines[1] = (5, lines[1][1])  # lines 2-4 were not delivered
    res = parse_torch(lines, file_id=FILE_ID, year=2024)
    assert rows(res.events, "global_rank", "rank", "pg", "ts", "ts_source") == [
        (None, 2, None, None, "none")
    ]


def test_nccl_error_with_last_error_lines() -> None:
    lines = [
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
        "c10d/ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, "
        "NCCL version 2.20.5",
        "[rank0]: ncclRemoteError: A call failed possibly due to a network error or a remote "
        "process exiting prematurely.",
        "[rank0]: Last error:",
        "[rank0]: NET/IB : Got completion from peer 10.4.1.22<53262> with status=12 opcode=0 "
        "len=0 vendor err 129 (Recv)",
    ]
    res = parse(lines)
    assert rows(res.events, "line_no", "global_rank", "kind", "message") == [
        (
            1,
            0,
            "nccl_error",
            "remote process exited or there was a network error, NCCL version 2.20.5 | "
            "ncclRemoteError: A call failed possibly due to a network error or a remote process "
            "exiting prematurely. | Last error: NET/IB : Got completion from peer "
            "10.4.1.22<53262> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
        )
    ]
    assert res.parsed == 4


def test_watchdog_terminated_by_an_nccl_error() -> None:
    lines = [
        "[E ProcessGroupNCCL.cpp:916] [Rank 3] NCCL watchdog thread terminated with exception: "
        "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL "
        "version 2.18.1",
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error. ",
        "Last error:",
        "socketStartConnect: Connect to 10.4.1.22<35771> failed : Software caused connection abort",
        "Exception raised from checkForNCCLErrorsInternal at ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1465 (most recent call first):",
    ]
    res = parse(lines)
    assert rows(res.events, "line_no", "rank", "kind", "message") == [
        (
            1,
            3,
            "watchdog_terminated",
            "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL "
            "version 2.18.1",
        ),
        (
            1,
            3,
            "nccl_error",
            "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1"
            " | ncclSystemError: System call (e.g. socket, malloc) or external library call "
            "failed or device error. | Last error: socketStartConnect: Connect to "
            "10.4.1.22<35771> failed : Software caused connection abort",
        ),
        (
            5,
            None,
            "exception",
            "checkForNCCLErrorsInternal at ../torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:1465",
        ),
    ]
    assert res.parsed == 5


def test_nccl_error_details_stop_at_a_gap_and_at_another_rank() -> None:
    head = (
        "[rank0]:[E ProcessGroupNCCL.cpp:1182] [Rank 0] NCCL error: invalid usage, NCCL "
        "version 2.19.3"
    )
    res = parse_torch(
        [(1, head), (3, "Last error:"), (4, "Duplicate GPU detected : rank 1 and rank 0")],
        file_id=FILE_ID,
        year=None,
    )
    assert rows(res.events, "kind", "message") == [
        ("nccl_error", "invalid usage, NCCL version 2.19.3")
    ]
    res = parse([head, "[rank1]: Last error:", "[rank1]: Duplicate GPU detected"])
    assert rows(res.events, "kind", "message") == [
        ("nccl_error", "invalid usage, NCCL version 2.19.3")
    ]


def test_closing_signal_in_three_logger_styles() -> None:
    lines = [
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 88 closing signal "
        "SIGTERM",
        "[2023-11-21 16:05:43,101] torch.distributed.elastic.multiprocessing.api: [WARNING] "
        "Sending process 48210 closing signal SIGTERM",
        "W0314 09:41:51.998000 140913 torch/distributed/elastic/multiprocessing/api.py:897] "
        "Sending process 141026 closing signal SIGTERM",
    ]
    res = parse(lines)
    assert rows(res.events, "line_no", "kind", "value", "message", "ts", "ts_source") == [
        (1, "closing_signal", 88, "SIGTERM", None, "none"),
        (2, "closing_signal", 48210, "SIGTERM", dt(2023, 11, 21, 16, 5, 43, 101000), "logger"),
        (3, "closing_signal", 141026, "SIGTERM", dt(2024, 3, 14, 9, 41, 51, 998000),
         "logger_no_year"),
    ]  # fmt: skip


# --------------------------------------------------------------------------------------
# torchelastic failures


def test_agent_failure_line_in_three_styles() -> None:
    lines = [
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 1 "
        "(pid: 87) of binary: /opt/conda/bin/python",
        "[2023-11-21 16:05:44,392] torch.distributed.elastic.multiprocessing.api: [ERROR] failed "
        "(exitcode: 1) local_rank: 2 (pid: 48211) of binary: /usr/bin/python3",
        "node-9: E0314 09:41:52.117000 140913 torch/distributed/elastic/multiprocessing/api.py:869]"
        " failed (exitcode: -9) local_rank: 5 (pid: 141027) of binary: /usr/bin/python",
    ]
    res = parse(lines)
    assert rows(res.failures, *FAILURE_COLS) == [
        (1, None, None, 1, 87, -6, "SIGABRT", False, "agent", None, "none"),
        (2, None, None, 2, 48211, 1, None, False, "agent", dt(2023, 11, 21, 16, 5, 44, 392000),
         "logger"),
        (3, "node-9", None, 5, 141027, -9, "SIGKILL", False, "agent",
         dt(2024, 3, 14, 9, 41, 52, 117000), "logger_no_year"),
    ]  # fmt: skip


SUMMARY = [
    "Traceback (most recent call last):",
    '  File "/usr/bin/torchrun", line 8, in <module>',
    "    raise ChildFailedError(",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "train.py FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "[1]:",
    "  time      : 2024-09-27_03:12:48",
    "  host      : gpu-node-07.cluster.local",
    "  rank      : 13 (local_rank: 5)",
    "  exitcode  : -6 (pid: 1184572)",
    "  error_file: <N/A>",
    "  traceback : Signal 6 (SIGABRT) received by PID 1184572",
    "[2]:",
    "  time      : 2024-09-27_03:12:48",
    "  host      : gpu-node-07.cluster.local",
    "  rank      : 14 (local_rank: 6)",
    "  exitcode  : -15 (pid: 1184573)",
    "  error_file: <N/A>",
    "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2024-09-27_03:12:47",
    "  host      : gpu-node-07.cluster.local",
    "  rank      : 8 (local_rank: 0)",
    "  exitcode  : 1 (pid: 1184567)",
    "  error_file: /tmp/torchelastic_x1/attempt_0/0/error.json",
    "  traceback : Traceback (most recent call last):",
    '    File "/opt/app/train.py", line 211, in main',
    "      loss.backward()",
    "  RuntimeError: CUDA error: an illegal memory access was encountered",
    "============================================================",
]
SUMMARY_ROWS = [
    (9, "gpu-node-07.cluster.local", 13, 5, 1184572, -6, "SIGABRT", False, "summary",
     dt(2024, 9, 27, 3, 12, 48), "logger"),
    (16, "gpu-node-07.cluster.local", 14, 6, 1184573, -15, "SIGTERM", False, "summary",
     dt(2024, 9, 27, 3, 12, 48), "logger"),
    (25, "gpu-node-07.cluster.local", 8, 0, 1184567, 1, None, True, "summary",
     dt(2024, 9, 27, 3, 12, 47), "logger"),
]  # fmt: skip


def test_elastic_summary() -> None:
    res = parse(SUMMARY)
    assert rows(res.failures, *FAILURE_COLS) == SUMMARY_ROWS
    assert res.failures["file_id"].to_list() == [FILE_ID] * 3
    # the traceback text and the Python traceback before the summary are no records
    assert res.parsed == len(SUMMARY) - 3 - 3
    assert res.events.height == 0


def test_elastic_summary_with_no_other_failures_under_pdsh() -> None:
    lines = [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "======================================================",
        "/opt/app/train.py FAILED",
        "------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2025-01-04_19:20:21",
        "  host      : 10.1.0.4",
        "  rank      : 3 (local_rank: 3)",
        "  exitcode  : -9 (pid: 5521)",
        "  error_file: <N/A>",
        "  traceback : Signal 9 (SIGKILL) received by PID 5521",
        "======================================================",
    ]
    want = [(9, "10.1.0.4", 3, 3, 5521, -9, "SIGKILL", True, "summary",
             dt(2025, 1, 4, 19, 20, 21), "logger")]  # fmt: skip
    assert rows(parse(lines).failures, *FAILURE_COLS) == want
    # pdsh adds the node name to every line; the summary's host field wins
    pdsh = parse(["node-1: " + line for line in lines])
    assert rows(pdsh.failures, *FAILURE_COLS) == want
    assert pdsh.parsed == len(lines)


def test_a_summary_whose_head_line_was_lost_is_read_from_its_frame() -> None:
    """The ``ChildFailedError:`` line damaged or cut: the ``====`` rule and the title
    under it still open the summary, and cost nothing more than the lost line."""
    lines = [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "======================================================",
        "/opt/app/train.py FAILED",
        "------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2025-01-04_19:20:21",
        "  host      : 10.1.0.4",
        "  rank      : 3 (local_rank: 3)",
        "  exitcode  : -9 (pid: 5521)",
        "  error_file: <N/A>",
        "  traceback : Signal 9 (SIGKILL) received by PID 5521",
        "======================================================",
    ]
    whole = parse(lines)
    headless = parse(["", *lines[1:]])
    assert headless.parsed == whole.parsed - 1
    assert rows(headless.failures, *FAILURE_COLS) == rows(whole.failures, *FAILURE_COLS)
    # through the framework reader, which delivers the rule above the title
    from ncclscope.parsers.torch.lines import PRECEDED

    assert pl.Series(lines[2:3]).str.contains(PRECEDED).to_list() == [True]
    # a stray "x FAILED" with no rule above it opens nothing
    stray = parse(["make: test FAILED", "  rank      : 3 (local_rank: 3)"])
    assert stray.parsed == 1  # the field alone (an implicit summary), not the title


def test_old_elastic_summary_format() -> None:
    # torch 1.9/1.10: Root Cause first, "Other Failures:", "msg:" instead of "traceback :"
    lines = [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "***************************************",
        "            train.py FAILED            ",
        "=======================================",
        "Root Cause:",
        "[0]:",
        "  time: 2021-10-12_08:55:17",
        "  rank: 3 (local_rank: 3)",
        "  exitcode: -6 (pid: 21533)",
        "  error_file: <N/A>",
        '  msg: "Signal 6 (SIGABRT) received by PID 21533"',
        "=======================================",
        "Other Failures:",
        "[1]:",
        "  time: 2021-10-12_08:55:18",
        "  rank: 0 (local_rank: 0)",
        "  exitcode: 1 (pid: 21530)",
        "  error_file: <N/A>",
        '  msg: "Process failed with exitcode 1"',
        "***************************************",
    ]
    res = parse(["gpu-a: " + line for line in lines])
    assert rows(res.failures, *FAILURE_COLS) == [
        (6, "gpu-a", 3, 3, 21533, -6, "SIGABRT", True, "summary", dt(2021, 10, 12, 8, 55, 17),
         "logger"),
        (14, "gpu-a", 0, 0, 21530, 1, None, False, "summary", dt(2021, 10, 12, 8, 55, 18),
         "logger"),
    ]  # fmt: skip


def test_agent_line_and_summary_entry_merge() -> None:
    lines = [
        "[2023-11-21 16:05:44,392] torch.distributed.elastic.multiprocessing.api: [ERROR] failed "
        "(exitcode: -6) local_rank: 5 (pid: 1184572) of binary: /usr/bin/python3",
        *SUMMARY[3:],
    ]
    res = parse(lines)
    # one row, pointing at the summary's entry (line 7), the report of record
    assert rows(res.failures, *FAILURE_COLS) == [
        (7, "gpu-node-07.cluster.local", 13, 5, 1184572, -6, "SIGABRT", False, "summary",
         dt(2023, 11, 21, 16, 5, 44, 392000), "logger"),
        *[(r[0] - 2, *r[1:]) for r in SUMMARY_ROWS[1:]],
    ]  # fmt: skip


# --------------------------------------------------------------------------------------
# Hard-wrapped lines, gaps, malformed lines


HEAD = "[rank0]:[E ProcessGroupNCCL.cpp:523] [Rank 0] " + WD
#: A watchdog line cut by a terminal: with the space kept or dropped, inside a token,
#: and over three lines.
WRAPS: dict[str, list[str]] = {
    "space-kept": [
        HEAD + "WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, "
        "Timeout(ms)=600000) ran for 600052 ",
        "milliseconds before timing out.",
    ],
    "space-dropped": [
        HEAD + "WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, "
        "Timeout(ms)=600000) ran for 600052",
        "milliseconds before timing out.",
    ],
    "mid-token": [
        HEAD + "WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=4, Nume",
        "lOut=4, Timeout(ms)=600000) ran for 600052 milliseconds before timing out.",
    ],
    "three-lines": [
        HEAD + "WorkNCCL(SeqNum=88, OpType=ALLRED",
        "UCE, NumelIn=4, NumelOut=4, Timeout(ms)=600",
        "000) ran for 600052 milliseconds before timing out.",
    ],
}


@pytest.mark.parametrize("lines", list(WRAPS.values()), ids=list(WRAPS))
def test_hard_wrapped_watchdog_line_is_joined(lines: list[str]) -> None:
    res = parse([*lines, "epoch 3 loss 2.31"])
    assert rows(res.timeouts, "line_no", "global_rank", "rank", "seq", "op", "numel_out") == [
        (1, 0, 0, 88, "ALLREDUCE", 4)
    ]
    assert rows(res.timeouts, "timeout_s", "ran_for_s") == [(600.0, 600.052)]
    assert (res.parsed, res.malformed) == (len(lines), 0)


def test_hard_wrapped_companion_and_agent_lines() -> None:
    res = parse(
        [
            "[PG 0 (default_pg) Rank 6] Timeout at NCCL work: 57, last enqueued ",
            "NCCL work: 58, last completed NCCL work: 56.",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank:"
            " 1 (pi",
            "d: 87) of binary: /opt/conda/bin/python",
        ]
    )
    assert rows(res.timeouts, "line_no", "rank", "seq", "last_enqueued", "last_completed") == [
        (1, 6, 57, 58, 56)
    ]
    assert rows(res.failures, "line_no", "local_rank", "pid", "exitcode") == [(3, 1, 87, -6)]
    assert (res.parsed, res.malformed) == (4, 0)


def test_no_join_across_a_gap() -> None:
    cut, tail = WRAPS["space-kept"]
    res = parse_torch([(10, cut), (12, tail)], file_id=FILE_ID, year=None)
    assert res.timeouts.height == 0
    assert (res.parsed, res.malformed, res.first_malformed, res.seen) == (0, 1, 10, True)


def test_no_join_with_a_line_that_has_its_own_prefix() -> None:
    cut, tail = WRAPS["space-kept"]
    res = parse([cut, "[rank1]:" + tail, "[rank0]:[E ProcessGroupNCCL.cpp:523] " + cut])
    assert res.timeouts.height == 0
    assert (res.malformed, res.first_malformed) == (2, 1)


def test_malformed_lines_are_counted_and_others_still_read() -> None:
    res = parse(
        [
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=",
            "",
            "[PG 0 Rank 1] Heartbeat monitor timed out! Process will be terminated",
            "[rank4]:[E ProcessGroupNCCL.cpp:523] "
            + wd("SeqNum=3, OpType=BARRIER, Timeout(ms)=1000", 1002, 4),
            "Sending process abc closing signal SIGTERM",  # no pid: not this family
        ]
    )
    assert rows(res.timeouts, "line_no", "seq") == [(4, 3)]
    # the heartbeat line lacks its size but is still an event (some builds omit it)
    assert rows(res.events, "line_no", "kind", "value") == [(3, "heartbeat_timeout", None)]
    assert (res.parsed, res.malformed, res.first_malformed) == (2, 1, 1)


def test_a_watchdog_line_without_optype_is_malformed() -> None:
    res = parse(["[Rank 0] " + WD + "WorkNCCL(SeqNum=1) ran for 5 milliseconds before timing out."])
    assert (res.timeouts.height, res.malformed, res.first_malformed) == (0, 1, 1)


def test_numbers_too_big_for_their_column_become_null() -> None:
    res = parse(
        [
            "[rank99999999999]: [Rank 4] "
            + WD
            + "WorkNCCL(SeqNum=99999999999999999999, OpType=ALLREDUCE, "
            "NumelIn=9223372036854775808, NumelOut=5, Timeout(ms)=600000) ran for "
            "9999999999999999999 milliseconds before timing out.",
            "Sending process 9999999999 closing signal SIGTERM",
        ]
    )
    assert rows(
        res.timeouts,
        "global_rank",
        "rank",
        "seq",
        "numel_in",
        "numel_out",
        "timeout_s",
        "ran_for_s",
    ) == [(None, 4, None, None, 5, 600.0, None)]
    assert rows(res.events, "kind", "value") == [("closing_signal", 9999999999)]
    # a timeout that does not fit is no timeout at all
    res = parse(["[Rank 4] " + WD + "WorkNCCL(SeqNum=1, OpType=X, Timeout(ms)=99999999999999999999)"
                 " ran for 1 milliseconds before timing out."])  # fmt: skip
    assert (res.timeouts.height, res.malformed) == (0, 1)


# --------------------------------------------------------------------------------------
# Version, and how the caller delivers lines


@pytest.mark.parametrize(
    ("line", "version"),
    [
        ("PyTorch version: 2.1.0+cu121", "2.1.0+cu121"),
        ("- PyTorch version (GPU?): 2.3.1 (True)", "2.3.1"),
        ("torch version .................... 2.4.0a0+3bcc3cd.nv24.07", "2.4.0a0+3bcc3cd.nv24.07"),
        ("[pip3] torch==2.5.1", "2.5.1"),
        ("[pip3] pytorch-triton==3.0.0", None),
    ],
)
def test_torch_version(line: str, version: str | None) -> None:
    res = parse([line])
    assert res.version == version
    assert (res.seen, res.parsed) == (False, 0)  # a version is not a distributed record


def deliver(lines: list[str]) -> list[tuple[int, str]]:
    """What the first pass hands over: candidates, the line after each, block lines."""
    s = pl.Series(lines, dtype=pl.String)
    cand = s.str.contains(CANDIDATES).to_list()
    block = s.str.contains(BLOCK_STARTS).to_list()
    keep: set[int] = set()
    for i, (c, b) in enumerate(zip(cand, block, strict=True)):
        if c:
            keep.update((i, i + 1))
        if b:
            keep.update(range(i, i + 1 + BLOCK_LINES))
    return [(i + 1, lines[i]) for i in sorted(keep) if i < len(lines)]


FILLER = [
    "Epoch 3:  42%|####2     | 250/596 [03:10<04:23,  1.31it/s, loss=2.31]",
    "epoch 3 loss 2.31",
    "gpu-node-07:20116:20116 [3] NCCL INFO AllReduce: opCount 1a sendbuff 0x7f2c4a000000 "
    "recvbuff 0x7f2c4c000000 count 262144 datatype 7 op 0 root 0 comm 0x55d1c2a4b2e0 "
    "[nranks=16] stream 0x55d1c29f7a10",
    "[2024-01-01 10:00:00,123] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, "
    "lr=[0.0001], mom=[(0.9, 0.999)]",
]


def composite_log() -> list[str]:
    """Every family at once, with filler between blocks."""
    out: list[str] = []
    for block in [
        WATCHDOG_LINES,
        FILLER,
        DESYNC_LAGGING,
        FILLER,
        # a three-line wrap cannot be read from a delivery: only one line follows a
        # candidate, so it stays out of this test
        [w for name, lines in WRAPS.items() if name != "three-lines" for w in lines],
        FILLER,
        [
            "[rank0]: torch.distributed.DistBackendError: NCCL error in: ../x.cpp:1970, "
            "remote process exited or there was a network error, NCCL version 2.20.5",
            "[rank0]: ncclRemoteError: A call failed possibly due to a network error.",
            "[rank0]: Last error:",
            "[rank0]: NET/IB : Got completion from peer 10.4.1.22<53262> with status=12",
            "Exception raised from c10_cuda_check_implementation at "
            "../c10/cuda/CUDAException.cpp:44 (most recent call first):",
        ],
        FILLER * 30,
        SUMMARY,
        FILLER,
    ]:
        out.extend(block)
    return out


def frames(res: TorchResult) -> tuple[list[dict[str, object]], ...]:
    return res.timeouts.to_dicts(), res.failures.to_dicts(), res.events.to_dicts()


def test_delivered_subset_reads_like_the_whole_file() -> None:
    log = composite_log()
    whole = parse(log)
    subset = deliver(log)
    assert len(subset) < len(log)
    part = parse_torch(subset, file_id=FILE_ID, year=2024)
    assert frames(part) == frames(whole)
    assert (part.parsed, part.malformed) == (whole.parsed, whole.malformed)
    assert whole.timeouts.height == len(WATCHDOG_ERAS) + 1
    assert whole.failures.height == 3
    assert sorted(set(whole.events["kind"])) == [
        "desync_lagging",
        "desync_timeout",
        "exception",
        "nccl_error",
    ]


def test_summary_seen_through_candidates_only() -> None:
    # a caller that missed the block: only candidates and the line after each, so the
    # second entry's "[2]:" line and the section rules are not delivered
    lines = [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "[1]:",
        "  time      : 2024-09-27_03:12:48",
        "  host      : gpu-node-07",
        "  rank      : 13 (local_rank: 5)",
        "  exitcode  : 1 (pid: 1184572)",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "[2]:",
        "  time      : 2024-09-27_03:12:49",
        "  host      : gpu-node-07",
        "  rank      : 14 (local_rank: 6)",
        "  exitcode  : -7 (pid: 1184573)",
        "  error_file: <N/A>",
        "  traceback : Signal 7 (SIGBUS) received by PID 1184573",
    ]
    s = pl.Series(lines).str.contains(CANDIDATES).to_list()
    keep = sorted({j for i, c in enumerate(s) if c for j in (i, i + 1) if j < len(lines)})
    assert 12 not in keep  # "[2]:"
    res = parse_torch([(i + 1, lines[i]) for i in keep], file_id=FILE_ID, year=None)
    assert rows(res.failures, *FAILURE_COLS) == [
        (6, "gpu-node-07", 13, 5, 1184572, 1, None, False, "summary",
         dt(2024, 9, 27, 3, 12, 48), "logger"),
        (14, "gpu-node-07", 14, 6, 1184573, -7, "SIGBUS", False, "summary",
         dt(2024, 9, 27, 3, 12, 49), "logger"),
    ]  # fmt: skip


VERSION_SAMPLES = [
    "PyTorch version: 2.1.0+cu121",
    "torch version .................... 2.1.0+cu121",
    "[pip3] torch==2.5.1",
]
CANDIDATE_SAMPLES = [
    *WATCHDOG_LINES,
    DESYNC_LAGGING[0],
    DESYNC_LAGGING[1],
    DESYNC_LAGGING[3],
    DESYNC_LAGGING[4],
    "\t - To our best knowledge, ranks [4, 7] are the lagging ranks that caused this timeout.",
    "[E ProcessGroupNCCL.cpp:1025] ",
    "[PG 1 Rank 2] Exception (either an error or timeout) detected by watchdog at work: 2641, "
    "last enqueued NCCL work: 2643, last completed NCCL work: 2640.",
    "[PG 0 (default_pg) Rank 6] Timeout at NCCL work: 57, last enqueued NCCL work: 58, last "
    "completed NCCL work: 56.",
    "[PG ID 0 PG GUID 0(default_pg) Rank 3]  failure detected by watchdog at work sequence id: 4 "
    "PG status: last enqueued work: 5, last completed work: 3",
    "[PG 0 Rank 3] Heartbeat monitor timed out! Process will be terminated after dumping debug "
    "info. workMetaList_.size()=57",
    "[PG 0 Rank 3] ProcessGroupNCCL's watchdog got stuck for 600 seconds without making progress",
    "[PG 2 Rank 6] Process group watchdog thread terminated with exception: NCCL error: x",
    "RuntimeError: NCCL error in: /opt/pytorch/ProcessGroupNCCL.cpp:47, unhandled cuda error, "
    "NCCL version 2.7.8",
    "Last error:",
    "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565"
    " (most recent call first):",
    "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 88 closing signal "
    "SIGTERM",
    "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 1 "
    "(pid: 87) of binary: /opt/conda/bin/python",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "Failures:",
    "Other Failures:",
    "Root Cause (first observed failure):",
    "Root Cause:",
    "  <NO_OTHER_FAILURES>",
    "  time      : 2024-09-27_03:12:48",
    "  rank      : 13 (local_rank: 5)",
    "  exitcode  : -6 (pid: 1184572)",
    "  traceback : Signal 6 (SIGABRT) received by PID 1184572",
    "  time: 2021-10-12_08:55:17",
    "  rank: 3 (local_rank: 3)",
    "  exitcode: -6 (pid: 21533)",
    *VERSION_SAMPLES,
]
NOT_CANDIDATES = [
    *FILLER,
    " 97%|#########7| 581/596 [14:02<00:21,  1.45s/it]",
    "",
    "gpu-node-07:20116:20116 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC",
    "gpu-node-07:20116:20116 [3] NCCL INFO comm 0x55d1c2a4b2e0 rank 3 nranks 16 cudaDev 3 "
    "nvmlDev 3 busId 3d000 commId 0x8a2f4c1d9e3b7a60 - Init COMPLETE",
    "[2024-01-01 10:00:00,123] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd: 87.31 "
    "| bwd: 175.22 | bwd_inner: 160.10 | bwd_allreduce: 15.01 | step: 21.80",
    "[2024-01-01 10:00:00,123] [INFO] [timer.py:260:stop] epoch=0/micro_step=10/global_step=10, "
    "RunningAvgSamplesPerSec=21.87, CurrSamplesPerSec=22.01, MemAllocated=5.3GB, "
    "MaxMemAllocated=9.8GB",
    "[W ProcessGroupNCCL.cpp:1856] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS=1 has no effect",
    "[rank0]:[W1108 03:00:00.000 44 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank 0] "
    "using GPU 0 to perform barrier as devices used by this process are currently unknown.",
    "Traceback (most recent call last):",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
]
BLOCK_SAMPLES = [
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "node-1: Failures:",
    "Root Cause (first observed failure):",
    "Root Cause:",
    DESYNC_LAGGING[0],
    "[E ProcessGroupNCCL.cpp:1025] ",
    "[rank2]:[E207 11:45:03.552 9931 ProcessGroupNCCL.cpp:1942] Rank 2",
]


def test_candidates_and_block_starts_in_polars() -> None:
    assert pl.Series(CANDIDATE_SAMPLES).str.contains(CANDIDATES).to_list() == [True] * len(
        CANDIDATE_SAMPLES
    )
    assert pl.Series(NOT_CANDIDATES).str.contains(CANDIDATES).to_list() == [False] * len(
        NOT_CANDIDATES
    )
    assert pl.Series(BLOCK_SAMPLES).str.contains(BLOCK_STARTS).to_list() == [True] * len(
        BLOCK_SAMPLES
    )
    # every block start is also a candidate, and block starts are rare
    assert pl.Series(BLOCK_SAMPLES).str.contains(CANDIDATES).all()
    not_blocks = [*NOT_CANDIDATES, *WATCHDOG_LINES]
    assert not pl.Series(not_blocks).str.contains(BLOCK_STARTS).any()


def test_candidate_samples_are_read() -> None:
    """Each sample either yields a record on its own or is a known part of a block."""
    parts = {
        "Last error:",
        "[E ProcessGroupNCCL.cpp:1025] ",
        DESYNC_LAGGING[0],
        "  <NO_OTHER_FAILURES>",
    }
    parts |= set(VERSION_SAMPLES)
    for line in CANDIDATE_SAMPLES:
        res = parse([line])
        assert res.malformed == 0, line
        assert (res.parsed == 1) != (line in parts), line


def test_every_family_needle_is_in_its_trigger_matches() -> None:
    # the parser checks the needles before the (costlier) trigger regex
    for line in CANDIDATE_SAMPLES:
        _, text = torch_lines._strip_prefixes(torch_lines._clean(line), 2024)
        for family in torch_lines._FAMILIES:
            if not family.needles or family.on_raw or not family.trigger_re.search(text):
                continue
            assert any(n in text for n in family.needles), (family.name, line)


def test_module_doctests() -> None:
    result = doctest.testmod(torch_lines, optionflags=doctest.ELLIPSIS)
    assert (result.failed, result.attempted > 0) == (0, True)


# --------------------------------------------------------------------------------------
# Robustness: long lines, arbitrary text


PATHOLOGICAL = [
    "[" * 1_000_000,
    " " * 1_000_000 + "[Rank 0] " + WD,
    (WD + "WorkNCCL(") * 20_000,
    "[1, " * 250_000,
    "[rank1]:" * 125_000,
    "a: " * 330_000,
    "NCCL error: " + "x" * 1_000_000,
    "\r" * 500_000 + "x" * 500_000,
    "time  :" + " " * 1_000_000,
    "[PG ID 1 PG GUID " + "9" * 1_000_000,
    ("\x1b[" + "1;" * 100) * 3000,
    "Heartbeat monitor timed out!" + " " * 1_000_000,
]


@pytest.mark.parametrize("line", PATHOLOGICAL, ids=range(len(PATHOLOGICAL)))
def test_megabyte_lines_are_cheap(line: str) -> None:
    t0 = time.perf_counter()
    parse([line, line, "milliseconds before timing out."])
    assert time.perf_counter() - t0 < 2.0


def test_parse_takes_any_iterable() -> None:
    gen = ((n, text) for n, text in [(1, WATCHDOG_LINES[1])])
    assert parse_torch(gen, file_id=0, year=None).timeouts.height == 1


FRAGMENTS = [
    "[rank3]:",
    "[default1]:",
    "node-1: ",
    "(RayTrainWorker pid=1, ip=10.0.0.1) ",
    "[E ProcessGroupNCCL.cpp:1] ",
    "[E1108 03:12:48.1 1 ProcessGroupNCCL.cpp:1] ",
    "E0314 09:41:52.1 1 api.py:1] ",
    "[PG 0 Rank 1] ",
    "[PG ID 0 PG GUID 0(x) Rank 1] ",
    "[Rank 1] ",
    WD,
    "WorkNCCL(SeqNum=1, OpType=X, NumelIn=18446744073709551615, Timeout(ms)=1) ran for 2 ",
    "milliseconds before timing out.",
    "Timeout at NCCL work: 1, last enqueued NCCL work: 2, last completed NCCL work: -1.",
    "\t - [2] Timeout at collective: X, #3",
    "[1, 2] finished collective #1, but didn't join collective #2",
    "[] joined but didn't finish collective #",
    "NCCL error: ",
    "Last error:",
    "ChildFailedError",
    "Root Cause (first observed failure):",
    "Failures:",
    "[0]:",
    "  rank      : 1 (local_rank: 1)",
    "  exitcode  : -99 (pid: 1)",
    "  time      : 2024-02-30_25:61:61",
    "failed (exitcode: -6) local_rank: 1 (pid: 2)",
    "Sending process 1 closing signal SIGTERM",
    "Heartbeat monitor timed out!",
    "\r",
    "\x1b[31m",
    "\x00",
    "\ufffd",
]
junk_text = st.text(max_size=3000)
fragment_text = st.lists(st.sampled_from(FRAGMENTS), max_size=8).map("".join)
any_line = st.one_of(junk_text, fragment_text, st.tuples(fragment_text, junk_text).map("".join))


@st.composite
def numbered(draw: st.DrawFn, line: st.SearchStrategy[str]) -> list[tuple[int, str]]:
    texts = draw(st.lists(line, max_size=25))
    steps = draw(st.lists(st.integers(1, 3), min_size=len(texts), max_size=len(texts)))
    out, no = [], 0
    for text, step in zip(texts, steps, strict=True):
        no += step
        out.append((no, text))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(numbered(any_line), st.one_of(st.none(), st.integers(1970, 2100)))
def test_never_raises(lines: list[tuple[int, str]], year: int | None) -> None:
    res = parse_torch(lines, file_id=1, year=year)
    assert res.timeouts.schema == TIMEOUTS_SCHEMA
    assert res.failures.schema == FAILURES_SCHEMA
    assert res.events.schema == TORCH_EVENTS_SCHEMA
    assert 0 <= res.parsed + res.malformed <= len(lines)
    assert res.seen == (res.parsed + res.malformed > 0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    numbered(junk_text),
    numbered(junk_text),
    st.integers(0, 10**6),
    st.integers(0, 4095),
    st.sampled_from(["", "[rank5]:", "node-3: [default2]:[rank5]:"]),
)
def test_watchdog_line_found_among_junk(
    before: list[tuple[int, str]],
    after: list[tuple[int, str]],
    seq: int,
    rank: int,
    prefix: str,
) -> None:
    no = (before[-1][0] if before else 0) + 2  # a gap on each side
    line = (
        f"{prefix}[E ProcessGroupNCCL.cpp:523] "
        + wd(f"SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000", 600001)
    ).replace("Watchdog", f"[Rank {rank}] Watchdog")
    lines = [*before, (no, line), *[(no + 1 + n, text) for n, text in after]]
    res = parse_torch(lines, file_id=1, year=None)
    found = res.timeouts.filter(pl.col("line_no") == no)
    assert rows(found, "rank", "seq", "op", "numel_in", "timeout_s", "ran_for_s") == [
        (rank, seq, "ALLREDUCE", 1, 600.0, 600.001)
    ]
    assert found["global_rank"].to_list() == [5 if prefix else None]
    assert found["host"].to_list() == ["node-3" if "node-3" in prefix else None]
