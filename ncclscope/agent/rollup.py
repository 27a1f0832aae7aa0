"""The node's own summary of its ranks' progress, per communicator: what Prometheus'
rules compare across nodes, so that their cost grows with nodes, not ranks.

The agent knows its own ranks.  From the job's rows (``{metric: [(labels, value), ...]}``,
as ``Agent._publish`` puts them on the board) it adds, per communicator its ranks are
on that has members on other nodes too (``ncclscope_node_collective_*``; a communicator
wholly on the node, its ``nranks`` all here and on this host, is the node's own
countdown's to watch):

* the node's highest and lowest sequence number (``ncclscope_collective_seq`` counts
  calls since the agent started, the same on every node); the lowest carries the list of
  the node's ranks on the communicator (``ranks``, fixed while it lives), from which the
  rules name the ranks of a node that holds a collective up;
* how long ago, on the agent's clock, the first of its ranks entered the node's highest
  collective, and that collective's op;
* at each mark (every 64 and 1,024 collectives) the newest mark one of its ranks reached
  and when the first of them reached it.

A rule then reads one series per node and communicator where it read one per rank and
communicator: ``max`` of the nodes' highest sequence is the leaders', a node whose
lowest is below it holds the collective up, and the shortest of the nodes' waits is how
long the communicator has been silent.  Every fact here but the wait is final once
written: a node's highest collective and its first arrival at a mark do not change as
more of its ranks arrive, so two nodes' series at the same sequence or mark compare the
same facts.

The members' rows the summary is made from stay in the agent (per rank and communicator,
they would be most of its series): of them only the sequence number
(``ncclscope_collective_seq{comm,rank}``) is exported, for drill-down.  The culprits'
rows lose their collective's sequence number (a label whose value would change with
every pending collective): it is exported as the value of
``ncclscope_pending_collective_seq{comm}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["MEMBER_ONLY", "NodeRollup", "exported", "node_rows"]

Rows = Sequence[tuple[tuple[str, ...], float]]
_Out = dict[str, list[tuple[tuple[str, ...], float]]]

_SEQ = "ncclscope_collective_seq"
_ENTERED = "ncclscope_collective_entered_timestamp_seconds"
_OP = "ncclscope_collective_op_info"
_MARK_SEQ = "ncclscope_collective_mark_seq"
_MARK_TS = "ncclscope_collective_mark_timestamp_seconds"
_CULPRIT = "ncclscope_timeout_culprit_info"
_WAIT = "ncclscope_node_collective_wait_seconds"
_SIZE = "ncclscope_communicator_ranks"
_HOST = "ncclscope_rank_info"

#: The members' rows (per rank and communicator, labels ``comm, rank[, op | every]``)
#: the summary reads and the agent does not export: the node's summary replaces them.
MEMBER_ONLY = frozenset({_ENTERED, _OP, _MARK_SEQ, _MARK_TS})


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), rank) if rank.isdigit() else (1 << 62, rank)


@dataclass
class _Summary:
    """The summary but its waits, and per communicator when the wait began."""

    rows: _Out = field(default_factory=dict)
    entered: dict[str, float] = field(default_factory=dict)

    def put(self, name: str, labels: tuple[str, ...], value: float) -> None:
        self.rows.setdefault(name, []).append((labels, value))

    def at(self, now: float) -> _Out:
        """The summary at ``now`` (Unix time on the agent's clock)."""
        out = dict(self.rows)
        if self.entered:
            out[_WAIT] = [((c,), max(0.0, now - t)) for c, t in self.entered.items()]
        return out


def _summary(rows: Mapping[str, Rows]) -> _Summary:
    got = _Summary()
    seqs: dict[str, dict[str, float]] = {}
    for (comm, rank), seq in rows.get(_SEQ, ()):
        seqs.setdefault(comm, {})[rank] = seq
    # A communicator whose every member runs on this node has nothing to compare across
    # nodes (its stalls are the node's own countdown's): no summary.
    sizes = {comm: n for (comm,), n in rows.get(_SIZE, ())}
    hosts = {rank: host for (rank, host), _one in rows.get(_HOST, ())}

    def here(comm: str, by_rank: Mapping[str, float]) -> bool:
        on = {hosts.get(rank) for rank in by_rank}
        return sizes.get(comm, math.inf) <= len(by_rank) and len(on) == 1 and None not in on

    seqs = {c: by_rank for c, by_rank in seqs.items() if not here(c, by_rank)}
    entered = {labels: ts for labels, ts in rows.get(_ENTERED, ())}
    ops = {(comm, rank): op for (comm, rank, op), _one in rows.get(_OP, ())}
    for comm in sorted(seqs):
        by_rank = seqs[comm]
        top = max(by_rank.values())
        members = ",".join(sorted(by_rank, key=_rank_order))
        got.put("ncclscope_node_collective_seq_max", (comm,), top)
        got.put("ncclscope_node_collective_seq_min", (comm, members), min(by_rank.values()))
        # The first of the node's ranks to enter its highest collective (ties: the lower
        # rank), where their lines had a time.
        leaders = sorted(
            (entered[(comm, rank)], _rank_order(rank), rank)
            for rank, seq in by_rank.items()
            if seq == top and (comm, rank) in entered
        )
        if leaders:
            first_ts, _order, first = leaders[0]
            got.entered[comm] = first_ts
            op = ops.get((comm, first))
            if op is not None:
                got.put("ncclscope_node_collective_op_info", (comm, op), 1.0)
    marks: dict[tuple[str, str], dict[str, float]] = {}
    for (comm, rank, every), seq in rows.get(_MARK_SEQ, ()):
        if comm in seqs:
            marks.setdefault((comm, every), {})[rank] = seq
    mark_ts = {labels: ts for labels, ts in rows.get(_MARK_TS, ())}
    for (comm, every), by_rank in sorted(marks.items(), key=lambda kv: (kv[0][0], int(kv[0][1]))):
        top = max(by_rank.values())
        times = [
            mark_ts[(comm, rank, every)]
            for rank, seq in by_rank.items()
            if seq == top and (comm, rank, every) in mark_ts
        ]
        if times:
            got.put("ncclscope_node_collective_mark_seq", (comm, every), top)
            got.put("ncclscope_node_collective_mark_timestamp_seconds", (comm, every), min(times))
    return got


def node_rows(rows: Mapping[str, Rows], now: float) -> _Out:
    """The node's summary per communicator (``ncclscope_node_collective_*``) from the
    job's rows, its waits at ``now`` (Unix time on the agent's clock).

    >>> rows = {
    ...     "ncclscope_collective_seq": [(("c1", "0"), 100.0), (("c1", "1"), 99.0)],
    ...     "ncclscope_collective_entered_timestamp_seconds": [
    ...         (("c1", "0"), 1000.5), (("c1", "1"), 990.0)],
    ...     "ncclscope_collective_op_info": [(("c1", "0", "AllReduce"), 1.0),
    ...                                      (("c1", "1", "AllGather"), 1.0)],
    ... }
    >>> for name, series in node_rows(rows, now=1010.0).items():
    ...     print(name, series)
    ncclscope_node_collective_seq_max [(('c1',), 100.0)]
    ncclscope_node_collective_seq_min [(('c1', '0,1'), 99.0)]
    ncclscope_node_collective_op_info [(('c1', 'AllReduce'), 1.0)]
    ncclscope_node_collective_wait_seconds [(('c1',), 9.5)]
    """
    return _summary(rows).at(now)


def _passed(rows: Mapping[str, Rows]) -> dict[str, Rows]:
    """The job's rows the agent exports as they are, but the culprits' (their
    collective's sequence number becomes the value of
    ``ncclscope_pending_collective_seq{comm}``)."""
    out: dict[str, Rows] = {k: v for k, v in rows.items() if k not in MEMBER_ONLY}
    culprits = rows.get(_CULPRIT)
    if culprits is not None:
        out[_CULPRIT] = [((comm, rank, op), one) for (comm, rank, op, _seq), one in culprits]
        seqs = {comm: seq for (comm, _rank, _op, seq), _one in culprits}
        out["ncclscope_pending_collective_seq"] = [
            ((comm,), float(seq)) for comm, seq in sorted(seqs.items()) if seq.isdigit()
        ]
    return out


def exported(rows: Mapping[str, Rows], now: float) -> dict[str, Rows]:
    """What the agent exports of the job's rows at ``now`` (Unix time on its clock): all
    but the members' own rows (``MEMBER_ONLY``), the culprits without their collective's
    sequence number, and the node's summary (``node_rows``)."""
    out = _passed(rows)
    out.update(node_rows(rows, now))
    return out


class NodeRollup:
    """``exported``, with the node's summary kept while the members' rows are the same
    objects (the agent rebuilds them only when a line changed them; the countdown's rows
    and the waits change every tick)."""

    def __init__(self) -> None:
        self._key: tuple[object, ...] = ()
        self._summary = _Summary()

    def __call__(self, rows: Mapping[str, Rows], now: float) -> dict[str, Rows]:
        # The lists themselves are held in the key, so their ids cannot be reused.
        key = tuple(rows.get(name) for name in (_SEQ, _SIZE, _HOST, *sorted(MEMBER_ONLY)))
        same = len(key) == len(self._key) and all(
            a is b for a, b in zip(key, self._key, strict=True)
        )
        if not same:
            self._key, self._summary = key, _summary(rows)
        out = _passed(rows)
        out.update(self._summary.at(now))
        return out
