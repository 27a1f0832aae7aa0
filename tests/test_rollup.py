"""The node's summary of its ranks per communicator (``ncclscope.agent.rollup``): from
hand-made rows, and from a real job's rows, where it must agree with the per-rank rows
it sums up."""

from __future__ import annotations

from pathlib import Path

import pytest

from ncclscope.agent.exporter import Board
from ncclscope.agent.live import job_rows
from ncclscope.agent.rollup import MEMBER_ONLY, NodeRollup, exported, node_rows
from ncclscope.analysis import run_analysis
from ncclscope.detect import Context
from ncclscope.synth import StopRank, SynthSpec, generate

SEQ = "ncclscope_collective_seq"
ENTERED = "ncclscope_collective_entered_timestamp_seconds"
OP = "ncclscope_collective_op_info"
MARK_SEQ = "ncclscope_collective_mark_seq"
MARK_TS = "ncclscope_collective_mark_timestamp_seconds"


def _rows() -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """Ranks 2, 3 and 10 of a node on c1 (rank 10 one collective behind, rank 3 the first
    into 41), rank 2 alone on c2 (no time for its line)."""
    return {
        SEQ: [(("c1", "10"), 40.0), (("c1", "2"), 41.0), (("c1", "3"), 41.0), (("c2", "2"), 7.0)],
        ENTERED: [(("c1", "10"), 990.0), (("c1", "2"), 1000.4), (("c1", "3"), 1000.1)],
        OP: [(("c1", "10", "AllGather"), 1.0), (("c1", "2", "ReduceScatter"), 1.0),
             (("c1", "3", "ReduceScatter"), 1.0), (("c2", "2", "AllReduce"), 1.0)],
        MARK_SEQ: [(("c1", "10", "64"), 0.0), (("c1", "2", "64"), 64.0),
                   (("c1", "3", "64"), 64.0), (("c1", "2", "1024"), 0.0)],
        MARK_TS: [(("c1", "10", "64"), 900.0), (("c1", "2", "64"), 990.2),
                  (("c1", "3", "64"), 990.3), (("c1", "2", "1024"), 900.0)],
        "ncclscope_timeout_culprit_info": [(("c1", "10", "ReduceScatter", "41"), 1.0)],
        "ncclscope_timeout_remaining_seconds": [(("c1",), 590.0)],
        "ncclscope_clock_timestamp_seconds": [((), 1010.1)],
    }  # fmt: skip


def test_the_summary_per_communicator() -> None:
    got = node_rows(_rows(), now=1010.1)
    assert got["ncclscope_node_collective_seq_max"] == [(("c1",), 41.0), (("c2",), 7.0)]
    # the ranks in numeric order, fixed whatever their sequence numbers
    assert got["ncclscope_node_collective_seq_min"] == [
        (("c1", "2,3,10"), 40.0),
        (("c2", "2"), 7.0),
    ]
    # rank 3 entered 41 first; c2's line had no time: no wait, no op
    assert got["ncclscope_node_collective_wait_seconds"] == [(("c1",), pytest.approx(10.0))]
    assert got["ncclscope_node_collective_op_info"] == [(("c1", "ReduceScatter"), 1.0)]
    # the newest mark one of the node's ranks reached, and its first rank's arrival
    assert got["ncclscope_node_collective_mark_seq"] == [
        (("c1", "64"), 64.0),
        (("c1", "1024"), 0.0),
    ]
    assert got["ncclscope_node_collective_mark_timestamp_seconds"] == [
        (("c1", "64"), 990.2),
        (("c1", "1024"), 900.0),
    ]


def test_what_the_agent_exports() -> None:
    rows = _rows()
    out = exported(rows, now=1010.1)
    assert not MEMBER_ONLY & out.keys()
    assert out[SEQ] is rows[SEQ]
    assert out["ncclscope_timeout_remaining_seconds"] is rows["ncclscope_timeout_remaining_seconds"]
    # the culprit without its collective's sequence number, which is a value of its own
    assert out["ncclscope_timeout_culprit_info"] == [(("c1", "10", "ReduceScatter"), 1.0)]
    assert out["ncclscope_pending_collective_seq"] == [(("c1",), 41.0)]
    # every name and label set is the catalog's
    Board().set("job", out)


def test_the_summary_is_kept_while_the_members_rows_are_the_same() -> None:
    rollup = NodeRollup()
    rows = _rows()
    first = rollup(rows, now=1010.1)
    # a new tick: a new dict, the same members' rows, the clock moved
    second = rollup({**rows, "ncclscope_timeout_remaining_seconds": [(("c1",), 589.0)]}, now=1011.1)
    assert second["ncclscope_node_collective_seq_min"] is first["ncclscope_node_collective_seq_min"]
    assert second["ncclscope_node_collective_wait_seconds"] == [(("c1",), pytest.approx(11.0))]
    assert second["ncclscope_timeout_remaining_seconds"] == [(("c1",), 589.0)]
    # a line came: the members' rows are new lists
    moved = {**rows, SEQ: [*rows[SEQ][:-1], (("c2", "2"), 8.0)]}
    third = rollup(moved, now=1012.1)
    assert third["ncclscope_node_collective_seq_max"] == [(("c1",), 41.0), (("c2",), 8.0)]
    assert third == exported(moved, now=1012.1)


def test_a_real_nodes_summary_agrees_with_its_ranks(tmp_path: Path) -> None:
    """node-1 of a 16-rank job on 2 nodes (the world and each node's communicator), whose
    rank 12 stopped before collective 40: its summary is what its ranks' rows say."""
    spec = SynthSpec(
        ranks=16, hosts=2, steps=6, layers=2, era="2.27", timestamps=True, seed=3,
        layout="per-rank", tp_traffic=True, faults=(StopRank(rank=12, at_instance=40),),
    )  # fmt: skip
    generate(spec, tmp_path / "job")
    files = sorted(str(f) for f in (tmp_path / "job").glob("node-1.*.log"))
    a = run_analysis(files, workdir=tmp_path / "w")
    last = Context(a.analysis).last_ts
    assert last is not None
    rows = job_rows(a, last)
    got = node_rows(rows, now=last.timestamp() + 5.0)
    seqs: dict[str, dict[str, float]] = {}
    for (comm, rank), seq in rows[SEQ]:
        seqs.setdefault(comm, {})[rank] = seq
    assert len(seqs) == 2  # the world and node-1's own
    entered = dict(rows[ENTERED])
    for (comm,), top in got["ncclscope_node_collective_seq_max"]:
        assert top == max(seqs[comm].values())
    behind = []
    for (comm, ranks), low in got["ncclscope_node_collective_seq_min"]:
        assert low == min(seqs[comm].values())
        assert ranks == ",".join(str(r) for r in range(8, 16))
        behind += [comm] if low < max(seqs[comm].values()) else []
    assert behind  # rank 12 stopped before the others' last collective
    for (comm,), wait in got["ncclscope_node_collective_wait_seconds"]:
        top = max(seqs[comm].values())
        first = min(entered[(comm, r)] for r, s in seqs[comm].items() if s == top)
        assert wait == pytest.approx(last.timestamp() + 5.0 - first)
    Board().set("job", exported(rows, now=last.timestamp()))


def test_no_summary_for_a_communicator_wholly_on_the_node() -> None:
    """Its size is the ranks seen here and they all run on this host: nothing to compare
    across nodes (the node's own countdown watches it)."""

    def summed(size: float, hosts: tuple[str, str]) -> list[tuple[tuple[str, ...], float]]:
        rows = {
            SEQ: [(("tp", "0"), 5.0), (("tp", "1"), 5.0)],
            "ncclscope_communicator_ranks": [(("tp",), size)],
            "ncclscope_rank_info": [(("0", hosts[0]), 1.0), (("1", hosts[1]), 1.0)],
        }
        return node_rows(rows, now=0.0).get("ncclscope_node_collective_seq_max", [])

    assert summed(2.0, ("node-0", "node-0")) == []
    assert summed(4.0, ("node-0", "node-0")) == [(("tp",), 5.0)]  # members elsewhere too
    assert summed(2.0, ("node-0", "node-1")) == [(("tp",), 5.0)]  # one agent, two hosts' logs
