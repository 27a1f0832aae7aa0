"""Declared polars schemas for every tidy table, and a checker used at table boundaries.

Columns are snake_case and carry their unit (``size_bytes``, ``total_s``); ``ts`` is a
UTC datetime; ``ts_source`` says where a time came from (DESIGN §4).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

__all__ = [
    "CLUSTER_INSTANCES_SCHEMA",
    "COLLECTIVES_SCHEMA",
    "COLL_STORE_SCHEMA",
    "COMMS_SCHEMA",
    "COMMUNICATORS_SCHEMA",
    "CONFIG_SCHEMA",
    "CONNECTIONS_SCHEMA",
    "COUNTDOWN_SCHEMA",
    "ERRORS_SCHEMA",
    "FAILURES_SCHEMA",
    "FLIGHT_DUMPS_SCHEMA",
    "FLIGHT_GROUPS_SCHEMA",
    "FLIGHT_JOIN_SCHEMA",
    "FLIGHT_PG_COMMS_SCHEMA",
    "FLIGHT_PG_STATUS_SCHEMA",
    "FLIGHT_SCHEMA",
    "GPU_SAMPLES_SCHEMA",
    "INPUTS_SCHEMA",
    "INSPECTOR_JOIN_SCHEMA",
    "INSPECTOR_SCHEMA",
    "INSTANCES_SCHEMA",
    "LATENESS_SCHEMA",
    "LINE_KIND",
    "LIVE_CALLS_SCHEMA",
    "MEMBERS_SCHEMA",
    "MEMORY_SCHEMA",
    "NCCL_TESTS_RUNS_SCHEMA",
    "NCCL_TESTS_SCHEMA",
    "PORT_SAMPLES_SCHEMA",
    "PROGRESS_SCHEMA",
    "RANKS_SCHEMA",
    "RAS_COMMS_SCHEMA",
    "RAS_RANKS_SCHEMA",
    "RAS_REPORTS_SCHEMA",
    "REPORT_STEPS_SCHEMA",
    "STEPS_SCHEMA",
    "TELEMETRY_SCHEMA",
    "TEXT_STORE_SCHEMA",
    "THROUGHPUT_SCHEMA",
    "TIMEOUTS_SCHEMA",
    "TIMERS_SCHEMA",
    "TORCH_EVENTS_SCHEMA",
    "TS",
    "SchemaMismatchError",
    "validate",
]

TS = pl.Datetime("us", "UTC")


def _schema(columns: Mapping[str, PolarsDataType]) -> pl.Schema:
    return pl.Schema(columns)


#: Line classes written by the first pass.
LINE_KIND: dict[str, int] = {"blank": 0, "binary": 1, "nccl": 2, "other": 3}

#: First-pass store of the COLL lines the vectorised field reader parsed.
COLL_STORE_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "i": pl.UInt32,  # 1-based line number within the file
        "proc": pl.String,  # the header token as printed: [prefix]host:pid:tid
        "op_tok": pl.String,  # "AllGather:" as printed
        "opcount": pl.Int64,
        "count": pl.Int64,
        "dtype": pl.Int16,
        "redop": pl.Int16,
        "root": pl.Int32,
        "comm": pl.String,
        "nranks_tok": pl.String,  # "[nranks=16]" as printed
        "ts": TS,
    }
)

#: First-pass store of the lines the fast path did not take, for the Python parser.
TEXT_STORE_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "i": pl.UInt32,
        "kind": pl.UInt8,  # LINE_KIND
        "text": pl.String,  # at most MAX_TEXT_CHARS characters
        "n_bytes": pl.Int32,  # of the whole line, as read (UTF-8)
    }
)

#: Per input: lines read, parsed and unparsed, and why lines were not parsed.
INPUTS_SCHEMA = _schema(
    {
        "path": pl.String,
        "size_bytes": pl.Int64,
        "lines": pl.Int64,
        "parsed": pl.Int64,
        "unparsed": pl.Int64,
        "blank": pl.Int64,  # empty or whitespace-only lines
        "other": pl.Int64,  # text that is not NCCL's (framework prints, progress bars)
        "malformed": pl.Int64,  # carries an NCCL marker but matches no NCCL grammar
        "binary": pl.Int64,  # invalid UTF-8 or control bytes, no NCCL record
        "too_long": pl.Int64,  # longer than any NCCL line can be
        # lines holding two processes' writes glued together: the complete tail was
        # parsed (counted in parsed), the other write's head fragment was lost
        "spliced": pl.Int64,
    }
)

#: One row per (process, communicator pointer): who holds which rank where.
MEMBERS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "host": pl.String,
        "pid": pl.Int32,
        "comm": pl.String,  # the %p pointer, unique only inside one process
        "comm_key": pl.String,  # identity across ranks: commId, else n<nranks>#<order>
        "comm_id": pl.String,
        "comm_rank": pl.Int32,
        "nranks": pl.Int32,
        "cuda_dev": pl.Int32,
        "nvml_dev": pl.Int32,
        "bus_id": pl.String,
        "complete": pl.Boolean,  # Init COMPLETE seen (not only START)
        "line_no": pl.UInt32,
        "rank": pl.Int32,  # global rank (rank in the world communicator) where known
        # init | init_timings | teardown | hint | elimination | coll: what named the member
        "known_from": pl.String,
        "ended": pl.String,  # Destroy | Abort: its "- Destroy/Abort COMPLETE" line
    }
)

#: One row per global rank.
RANKS_SCHEMA = _schema(
    {
        "rank": pl.Int32,
        "host": pl.String,
        "pid": pl.Int32,
        "path": pl.String,
        "cuda_dev": pl.Int32,
        "nvml_dev": pl.Int32,
        "bus_id": pl.String,
        "local_rank": pl.Int32,
    }
)

#: One row per communicator matched across ranks.
COMMUNICATORS_SCHEMA = _schema(
    {
        "comm_key": pl.String,
        "comm_id": pl.String,
        "nranks": pl.Int32,
        "nnodes": pl.Int32,
        "members_seen": pl.Int32,
        "ranks_seen": pl.List(pl.Int32),
        "matched_by": pl.String,  # commId | order
        "aborted": pl.Int32,  # members that logged "Abort START/COMPLETE"
        "calls": pl.Int64,
        "last_seq": pl.Int64,
    }
)

#: One row per COLL line (lives in Parquet; read lazily).
COLLECTIVES_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "line_no": pl.UInt32,
        "host": pl.String,
        "pid": pl.Int32,
        "tid": pl.Int32,
        "comm": pl.String,
        "comm_key": pl.String,
        "rank": pl.Int32,  # global rank where known, else the communicator rank
        "comm_rank": pl.Int32,
        "op": pl.String,
        "seq": pl.Int64,  # position of the call in its communicator: the instance key
        "opcount": pl.Int64,
        "count": pl.Int64,
        "dtype": pl.Int16,
        "size_bytes": pl.Int64,
        "redop": pl.Int16,
        "root": pl.Int32,
        "nranks": pl.Int32,
        "ts": TS,
        "ts_source": pl.String,
    }
)

#: One row per transport connection line.
CONNECTIONS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "host": pl.String,
        "pid": pl.Int32,
        "channel": pl.Int32,
        "src": pl.Int32,
        "dst": pl.Int32,
        "direction": pl.String,
        "transport": pl.String,
        "via": pl.String,
        "line_no": pl.UInt32,
    }
)

#: One row per error group: a WARN (or an orphan return-code chain) and its chain.
ERRORS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "line_no": pl.UInt32,
        "host": pl.String,
        "pid": pl.Int32,
        "tid": pl.Int32,
        "rank": pl.Int32,
        "kind": pl.String,
        "severity": pl.String,
        "message": pl.String,
        "signature": pl.String,  # the message with numbers and addresses masked, for grouping
        "hint": pl.String,  # what the error means, where the message alone is cryptic
        "src": pl.String,  # NCCL source file:line of the WARN
        "chain": pl.List(pl.String),  # the `file:line -> code` lines that followed
        "code": pl.Int32,  # the ncclResult_t the chain returned, when seen
        "ts": TS,
    }
)


# --- PyTorch and DeepSpeed tables (issue #3).  ``file_id``/``line_no`` point at the
# line in the inputs; ``ts`` is UTC; ``ts_source`` is "logger" (a framework header with a
# full date), "logger_no_year" (a glog header: month and day only, year taken from
# another line or the file's time), or "none".

#: One row per PyTorch watchdog timeout line (or a lone ``Timeout at NCCL work: N``).
TIMEOUTS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "line_no": pl.UInt32,
        "host": pl.String,  # pdsh / launcher host where printed
        "global_rank": pl.Int32,  # the ``[rankG]:`` prefix
        "rank": pl.Int32,  # the ``[Rank r]`` inside the message: rank in the PG
        "pg": pl.String,  # process group id/uid as printed (``0``, ``1``), null if absent
        "pg_desc": pl.String,  # ``default_pg`` and the like
        "seq": pl.Int64,  # SeqNum (or the work number of ``Timeout at NCCL work``)
        "op": pl.String,  # OpType as printed: _ALLGATHER_BASE, ALLREDUCE, ...
        "numel_in": pl.Int64,  # null when absent or the 2^64-1 sentinel
        "numel_out": pl.Int64,
        "timeout_s": pl.Float64,
        "ran_for_s": pl.Float64,
        "last_enqueued": pl.Int64,  # from the companion "last enqueued ... work" line
        "last_completed": pl.Int64,
        "ts": TS,
        "ts_source": pl.String,
    }
)

#: One row per process failure: torchelastic's ChildFailedError summary entries and
#: the agent's ``failed (exitcode: N) local_rank: L (pid: P)`` lines.
FAILURES_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "line_no": pl.UInt32,
        "host": pl.String,
        "rank": pl.Int32,  # global rank (``[13]:`` / ``rank : 13``)
        "local_rank": pl.Int32,
        "pid": pl.Int32,
        "exitcode": pl.Int32,
        "signal": pl.String,  # SIGABRT for exitcode -6, from the traceback line or the code
        "root_cause": pl.Boolean,  # listed under "Root Cause (first observed failure)"
        "source": pl.String,  # summary | agent
        "ts": TS,
        "ts_source": pl.String,
    }
)

#: Other PyTorch distributed events: heartbeat monitor, watchdog stuck/terminated,
#: desync reports, ``NCCL error ... Last error:`` lines, exceptions.
TORCH_EVENTS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "line_no": pl.UInt32,
        "host": pl.String,
        "global_rank": pl.Int32,
        "rank": pl.Int32,  # rank in the PG where printed
        "pg": pl.String,
        # heartbeat_timeout | watchdog_stuck | watchdog_terminated | process_abort |
        # desync_timeout | desync_lagging | nccl_error | exception | closing_signal |
        # work_status | cuda_oom
        "kind": pl.String,
        "seq": pl.Int64,
        "op": pl.String,
        "ranks": pl.List(pl.Int32),  # desync: the lagging ranks named
        "value": pl.Int64,  # outstanding works (heartbeat), seconds (stuck), ...
        "message": pl.String,
        "ts": TS,
        "ts_source": pl.String,
    }
)

#: One row per timer value of a DeepSpeed ``time (ms) | name: value | ...`` line.
TIMERS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "line_no": pl.UInt32,
        "rank": pl.Int32,  # the [Rank N] / rank=N that printed it (rank 0 in practice)
        "step": pl.Int64,  # the global step where known
        "name": pl.String,  # normalised to DeepSpeed >= 0.10.1 names (fwd, bwd_inner, ...)
        "name_printed": pl.String,
        "duration_s": pl.Float64,
        "ts": TS,
        "ts_source": pl.String,
    }
)

#: One row per DeepSpeed throughput line.
THROUGHPUT_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "line_no": pl.UInt32,
        "epoch": pl.Int64,
        "micro_step": pl.Int64,
        "global_step": pl.Int64,
        "samples_per_s": pl.Float64,  # current
        "avg_samples_per_s": pl.Float64,  # running average
        "mem_allocated_bytes": pl.Int64,
        "max_mem_allocated_bytes": pl.Int64,
        "ts": TS,
        "ts_source": pl.String,
    }
)

#: One row per DeepSpeed ``see_memory_usage`` report (its three lines joined).
MEMORY_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "line_no": pl.UInt32,  # the MA line
        "label": pl.String,  # the message logged before the figures
        "allocated_bytes": pl.Int64,  # MA
        "max_allocated_bytes": pl.Int64,  # Max_MA
        "cached_bytes": pl.Int64,  # CA
        "max_cached_bytes": pl.Int64,  # Max_CA
        "cpu_used_bytes": pl.Int64,
        "cpu_percent": pl.Float64,
        "ts": TS,
        "ts_source": pl.String,
    }
)

#: One row per DeepSpeed comms-logger record: a summary-table row or a verbose call.
COMMS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "line_no": pl.UInt32,
        "source": pl.String,  # summary | call
        "op": pl.String,  # all_gather_into_tensor, ...
        "msg_size_bytes": pl.Int64,
        "count": pl.Int64,  # calls (summary); 1 (call)
        "latency_s": pl.Float64,  # average (summary) or this call's
        "total_latency_s": pl.Float64,
        "algbw_bytes_per_s": pl.Float64,
        "busbw_bytes_per_s": pl.Float64,
        "ts": TS,
        "ts_source": pl.String,
    }
)


# --- PyTorch Flight Recorder dumps (issue #15).  ``file_id`` indexes ``Analysis.paths``:
# the dumps come after the logs there, and have no lines (``Analysis.sources`` holds only
# the logs).  ``rank`` is the global rank of the process that wrote the dump.

#: One row per dump file read (or refused): what it held and what was skipped.
FLIGHT_DUMPS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "path": pl.String,
        "size_bytes": pl.Int64,
        "format": pl.String,  # pickle | json
        "version": pl.String,  # the dump's "version" as written ("2.10"), null if absent
        "layout": pl.String,  # 1.x | 2.x | unknown: which keys were read
        "rank": pl.Int32,
        "rank_source": pl.String,  # file_name | p2p (own side of a send/recv) | none
        "comm_lib_version": pl.String,  # comm_lib_version / nccl_version where written
        "entries": pl.Int64,  # entries in the dump
        "read": pl.Int64,  # entries read into FLIGHT_SCHEMA
        "skipped": pl.Int64,  # entries skipped (a field missing, ill-typed or out of range)
        "groups": pl.Int64,  # process groups in pg_config
        "problem": pl.String,  # why nothing was read (refused, truncated), else null
    }
)

#: One row per Flight Recorder entry: a collective or point-to-point call as PyTorch
#: enqueued it, with its state at the time of the dump.
FLIGHT_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "rank": pl.Int32,  # global rank of the dump's process, null when unknown
        "record_id": pl.Int64,  # position in the recorder's ring (per process)
        "pg_id": pl.Int64,
        "pg_name": pl.String,  # the process group's name ("0", "1", or a hash)
        "pg_desc": pl.String,  # default_pg, undefined, a user's description
        "collective_seq_id": pl.Int64,  # per (process group, rank): collectives from 1
        "p2p_seq_id": pl.Int64,  # per (process group, rank): point-to-point calls
        "op_id": pl.Int64,  # logical ops (one per op inside a coalesced group)
        "profiling_name": pl.String,  # as written: "nccl:all_reduce", "nccl:send 0->1"
        "backend": pl.String,  # nccl | gloo | xccl | ... (the profiling name's prefix)
        "op": pl.String,  # NCCL's name where there is one: AllReduce, Send, ...
        "is_p2p": pl.Boolean,
        "peer": pl.Int32,  # send/recv: the other side's rank in the process group
        "state": pl.String,  # scheduled | started | completed, as written
        # state completed, or a collective at or below its group's pg_status
        # last_completed_collective (gloo leaves state at "scheduled"; there a call that
        # timed out and was retired counts as completed too: finished, with or without
        # an error)
        "completed": pl.Boolean,
        "created_ts": TS,  # time_created_ns: enqueued by the CPU
        "started_ts": TS,  # time_discovered_started_ns: seen started by the watchdog
        "completed_ts": TS,  # time_discovered_completed_ns: seen completed
        "duration_ms": pl.Float64,  # GPU time (only with TORCH_NCCL_ENABLE_TIMING)
        "input_numel": pl.Int64,  # elements over every input tensor
        "output_numel": pl.Int64,
        "input_dtype": pl.String,  # first input's dtype as written ("Float")
        "output_dtype": pl.String,
        "input_bytes": pl.Int64,  # null where a dtype's size is unknown
        "output_bytes": pl.Int64,
        "coll_count": pl.Int64,  # the count NCCL's COLL line would print for this call
        "coll_dtype": pl.Int16,  # the ncclDataType_t it would print
        "timeout_ms": pl.Int64,
        "retired": pl.Boolean,  # no longer watched: completed, or timed out
        "thread_name": pl.String,
        "frame": pl.String,  # first stack frame outside torch: "train_step at train.py:42"
    }
)

#: One row per (dump, process group) of a dump's pg_config.
FLIGHT_GROUPS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "rank": pl.Int32,
        "pg_name": pl.String,
        "pg_desc": pl.String,
        "pg_ranks": pl.List(pl.Int32),  # global ranks of the members
        "size": pl.Int32,
    }
)

#: One row per (dump, process group) of a dump's pg_status: how far each group got.
FLIGHT_PG_STATUS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "rank": pl.Int32,
        "pg_id": pl.Int64,
        "pg_name": pl.String,  # from the entries' (pg_id, process group), null if none
        "last_enqueued": pl.Int64,  # collective_seq_id; -1: none
        "last_started": pl.Int64,  # -1 unless timing was enabled
        "last_completed": pl.Int64,
    }
)

#: Per process group of the dumps: the logs' communicator it maps to, or why none.
FLIGHT_PG_COMMS_SCHEMA = _schema(
    {
        "pg_name": pl.String,
        "pg_desc": pl.String,
        "pg_ranks": pl.List(pl.Int32),  # null: pg_config does not list the group
        # ranks whose dumps hold calls of the group: a lower bound of its members
        # where pg_config is silent (PyTorch 2.14 on gloo lists only the default group)
        "ranks_with_entries": pl.List(pl.Int32),
        "comm_key": pl.String,  # null: not joined (see reason)
        "offset": pl.Int64,  # COLL seq = collective_seq_id + offset
        "checked": pl.Int64,  # dump entries with a COLL line at seq + offset
        "matched": pl.Int64,  # ... whose op and count agree
        "reason": pl.String,  # joined | no_logs | no_communicator | no_alignment
    }
)

#: Per (process group, rank, collective_seq_id) joined to the logs: the dump's state and
#: times beside the COLL line of the same call.
FLIGHT_JOIN_SCHEMA = _schema(
    {
        "pg_name": pl.String,
        "rank": pl.Int32,
        "collective_seq_id": pl.Int64,
        "record_id": pl.Int64,
        "op": pl.String,
        "state": pl.String,
        "created_ts": TS,
        "started_ts": TS,
        "completed_ts": TS,
        "comm_key": pl.String,
        "seq": pl.Int64,  # the COLL line's instance key; null: no line for this call
        "file_id": pl.UInt32,  # the COLL line
        "line_no": pl.UInt32,
        "size_bytes": pl.Int64,  # from the COLL line
        "ts": TS,  # the COLL line's time
        "agrees": pl.Boolean,  # op and count agree; null without a line
    }
)


# --- Detector metrics (issue #4): aggregates of the collectives table, per member or per
# instance, never per line.

#: Per (communicator, member): how far it got.
#: The agent's live progress: each member's last calls (``agent.progress``), one row a
#: COLL line as the agent read it.
LIVE_CALLS_SCHEMA = _schema(
    {
        "path": pl.String,  # the followed file
        "host": pl.String,
        "pid": pl.Int32,
        "comm": pl.String,
        "op": pl.String,
        "opcount": pl.Int64,
        "count": pl.Int64,
        "dtype": pl.Int16,
        "nranks": pl.Int32,
        "ts": TS,
        "idx": pl.Int64,  # the member's calls before this one (Send/Recv included)
        "coll_idx": pl.Int64,  # its collective calls before this one; null for Send/Recv
        "line_no": pl.UInt32,  # the call's number among the member's calls, from 1
    }
)

PROGRESS_SCHEMA = _schema(
    {
        "comm_key": pl.String,
        "comm_rank": pl.Int32,
        "rank": pl.Int32,
        "host": pl.String,
        "calls": pl.UInt32,
        "last_seq": pl.Int64,  # the last collective it logged
        "file_id": pl.UInt32,  # where: its last COLL line
        "line_no": pl.UInt32,
        # sum of a hash of (op, count, datatype) over its calls: members that made the
        # same calls have the same signature, one different call changes it
        "signature": pl.UInt64,
    }
)

#: Per collective instance (communicator, sequence), for a sample of the sequences.
INSTANCES_SCHEMA = _schema(
    {
        "comm_key": pl.String,
        "seq": pl.Int64,
        "n": pl.UInt32,  # members that logged it
        "ts_min": TS,  # first and last arrival
        "ts_max": TS,
        "with_ts": pl.UInt32,  # members whose line carried a time
    }
)

#: Per (communicator, member): lateness over the instances every member was timed at.
LATENESS_SCHEMA = _schema(
    {
        "comm_key": pl.String,
        "comm_rank": pl.Int32,
        "rank": pl.Int32,
        "host": pl.String,
        "instances": pl.UInt32,
        "last": pl.UInt32,  # instances it arrived last at
        "median_s": pl.Float64,  # lateness = arrival - the earliest member's arrival
        "p95_s": pl.Float64,
        "mean_s": pl.Float64,
        "gap_s": pl.Float64,  # the communicator's median time between collectives
        "members": pl.UInt32,
        "file_id": pl.UInt32,  # its first timed call
        "line_no": pl.UInt32,
    }
)

#: Per communicator with a collective some members entered and others did not.
COUNTDOWN_SCHEMA = _schema(
    {
        "comm_key": pl.String,
        "seq": pl.Int64,  # the oldest collective not every member entered
        "op": pl.String,
        "entered_ranks": pl.List(pl.Int32),
        "culprit_ranks": pl.List(pl.Int32),  # members that had not entered it
        "culprit_hosts": pl.List(pl.String),
        "since": TS,  # first arrival at it
        "age_s": pl.Float64,
        "timeout_s": pl.Float64,
        "left_s": pl.Float64,  # negative: the timeout has passed
    }
)

#: The config doctor's observations: what the logs cannot tell, and hazards.
CONFIG_SCHEMA = _schema(
    {
        "kind": pl.String,  # gap | hazard
        "what": pl.String,
        "settings": pl.List(pl.String),
        "detail": pl.String,
    }
)


#: The agent's telemetry parts (one row per time, metric and series; long format, so a
#: new metric needs no new column).
TELEMETRY_SCHEMA = _schema(
    {
        "ts": TS,
        "host": pl.String,
        "metric": pl.String,  # a catalog name, e.g. ncclscope_gpu_memory_used_bytes
        "labels": pl.String,  # label values joined by ",", in the catalog's label order
        "value": pl.Float64,
    }
)


#: The cluster's own exporters, read from its Prometheus (``analyze --prometheus``,
#: ``ncclscope.cluster``): node_exporter's InfiniBand collector, one row per time, port
#: and counter.  ``metric`` is node_exporter's name less ``node_infiniband_``
#: (``symbol_error_total``, ``link_downed_total``, ``port_transmit_wait_total``,
#: ``state_id``); ``kind`` how ``value`` was read: ``increase`` (the counter's increase
#: over the step ending at ``ts``), ``rate_per_s`` or ``gauge``.
PORT_SAMPLES_SCHEMA = _schema(
    {
        "ts": TS,
        "host": pl.String,  # as the logs spell it
        "device": pl.String,  # mlx5_0
        "port": pl.String,  # "1"
        "metric": pl.String,
        "kind": pl.String,
        "value": pl.Float64,
    }
)

#: dcgm-exporter's GPU health fields, one row per time, GPU and field (``metric``:
#: ``DCGM_FI_DEV_XID_ERRORS``, ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``,
#: ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``, ...; ``kind`` as for ports).
GPU_SAMPLES_SCHEMA = _schema(
    {
        "ts": TS,
        "host": pl.String,
        "gpu": pl.String,  # dcgm-exporter's ``gpu`` label: "0"
        "uuid": pl.String,
        "metric": pl.String,
        "kind": pl.String,
        "value": pl.Float64,
    }
)

#: How each scraped instance was tied to a host of the logs (``how``: ``uname``
#: (node_uname_info's nodename), ``dcgm`` (its Hostname label), ``agent``
#: (ncclscope_node_info), ``instance`` (the target's own host name)); ``host`` null where
#: no log host matched.
CLUSTER_INSTANCES_SCHEMA = _schema(
    {
        "instance": pl.String,
        "job": pl.String,
        "host": pl.String,
        "how": pl.String,
    }
)


#: The timeline (issue #6): per rank, per training step, per phase, from the world
#: communicator's per-step collective pattern (every rank) or DeepSpeed's timers (the rank
#: that printed them).  ``ncclscope.model.timeline`` documents how phases are cut.
STEPS_SCHEMA = _schema(
    {
        "rank": pl.Int32,  # global rank where known, else the world communicator's rank
        "host": pl.String,
        "step": pl.Int64,  # 1-based: the n-th full step of the collective pattern / timer's step
        "phase": pl.String,  # forward | backward | optimizer
        "start_ts": TS,  # null for timer rows (a timer line gives a duration and its own time)
        "end_ts": TS,  # for timer rows: the time of the timer line
        "duration_s": pl.Float64,
        "source": pl.String,  # collectives | timers
        "file_id": pl.UInt32,  # the line that ends the phase: a COLL line or the timer line
        "line_no": pl.UInt32,
    }
)


#: The HTML report's steps: one row per (rank, step, phase) for its step-phase
#: breakdown, the step markers and the heatmap's step columns.  ``rank`` is null when the
#: row speaks for the whole job; ``start``/``end`` are null when the source has no time.
REPORT_STEPS_SCHEMA = _schema(
    {
        "rank": pl.Int32,
        "step": pl.Int64,
        "phase": pl.String,
        "start": TS,
        "end": TS,
        "duration_s": pl.Float64,
        "source": pl.String,  # deepspeed_timers | collectives
    }
)


#: One row per NCCL Inspector record (``<host>-pid<pid>.log``, one JSON object a line):
#: a completed collective of one rank of one communicator.
INSPECTOR_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "line_no": pl.UInt32,
        "host": pl.String,  # metadata.hostname
        "pid": pl.Int32,
        "comm_hash": pl.String,  # header.id, lower-case hex without 0x or leading zeros
        "comm_name": pl.String,  # header.comm_name (2.30+), null when absent or "unknown"
        "comm_rank": pl.Int32,  # header.rank: the rank in that communicator
        "nranks": pl.Int32,
        "nnodes": pl.Int32,
        "op": pl.String,  # AllGather, AllReduce, ReduceScatter, ... (NCCL's spelling)
        "sn": pl.Int64,  # coll_sn: per communicator and op, from 0
        "msg_size_bytes": pl.Int64,  # per-rank buffer: type size x count
        "exec_time_s": pl.Float64,  # coll_exec_time_us / 1e6
        "timing_source": pl.String,  # kernel_gpu | kernel_cpu | collective_cpu
        "algo_bw_bytes_per_s": pl.Float64,
        "bus_bw_bytes_per_s": pl.Float64,
        "dump_ts": TS,  # metadata.dump_timestamp_us
        "format_version": pl.String,  # metadata.inspector_output_format_version
    }
)

#: Per Inspector record joined to the logs: the COLL line with the same communicator,
#: rank, op and occurrence (the sn-th call of that op on that communicator).
INSPECTOR_JOIN_SCHEMA = _schema(
    {
        "comm_key": pl.String,
        "comm_rank": pl.Int32,
        "rank": pl.Int32,  # global rank where the logs say
        "op": pl.String,
        "sn": pl.Int64,
        "seq": pl.Int64,  # the COLL line's position in its communicator
        "size_bytes": pl.Int64,  # from the COLL line
        "msg_size_bytes": pl.Int64,  # from Inspector
        "exec_time_s": pl.Float64,
        "bus_bw_bytes_per_s": pl.Float64,
        "agree": pl.Boolean,  # the COLL line's size is Inspector's (count x type size)
    }
)

#: One row per nccl-tests run (one ``*_perf`` output): its header.
NCCL_TESTS_RUNS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "run": pl.Int32,  # order of the run in its file, from 0
        "test": pl.String,  # all_reduce | all_gather | reduce_scatter | ... (from the table)
        "version": pl.String,  # "# nccl-tests version 2.13.8 ..." where printed
        "nccl_version": pl.String,  # "nccl-headers=..."/"# NCCL version" where printed
        "n_threads": pl.Int32,
        "n_gpus": pl.Int32,  # GPUs per thread (-g)
        "iters": pl.Int32,
        "warmup_iters": pl.Int32,
        "ranks": pl.Int32,  # "# Using devices" rows
        "hosts": pl.List(pl.String),
        "avg_bus_bw_bytes_per_s": pl.Float64,  # "# Avg bus bandwidth" line
        "rows": pl.Int32,
        "wrong": pl.Int64,  # rows with #wrong > 0 (old versions: an error above 0)
    }
)

#: One row per line of an nccl-tests table: one message size.
NCCL_TESTS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "run": pl.Int32,
        "line_no": pl.UInt32,
        "test": pl.String,
        "size_bytes": pl.Int64,
        "count": pl.Int64,
        "dtype": pl.String,
        "redop": pl.String,  # null where the table has no redop column
        "root": pl.Int32,  # null where the table has no root column (-1 printed: none)
        "oop_time_s": pl.Float64,
        "oop_algo_bw_bytes_per_s": pl.Float64,
        "oop_bus_bw_bytes_per_s": pl.Float64,
        "oop_wrong": pl.Float64,  # #wrong, or the max error of old versions; null for N/A
        "ip_time_s": pl.Float64,
        "ip_algo_bw_bytes_per_s": pl.Float64,
        "ip_bus_bw_bytes_per_s": pl.Float64,
        "ip_wrong": pl.Float64,
    }
)

#: One row per RAS report (``ncclras``, text or ``-f json``).
RAS_REPORTS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "format": pl.String,  # text | json
        "nccl_version": pl.String,
        "cuda_runtime_version": pl.Int32,
        "cuda_driver_version": pl.Int32,
        "ts": TS,  # the JSON's timestamp (local time read as UTC); null in text
        "nodes": pl.Int32,  # job summary
        "processes": pl.Int32,
        "gpus": pl.Int32,
        "communicators": pl.Int32,
        "missing_processes": pl.Int32,  # INCOMPLETE: processes that did not answer
        "dead_processes": pl.Int32,  # DEAD: unreachable via the RAS network
        "timeouts": pl.Int32,
    }
)

#: One row per communicator (JSON) or group of communicators (text) of a RAS report.
RAS_COMMS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "group": pl.Int32,  # text: the "Group #"; json: position
        "comm_hash": pl.String,  # lower-case hex without 0x; null for a text group row
        "comms": pl.Int32,  # communicators in the group (1 in json)
        "nranks": pl.Int32,
        "nodes": pl.Int32,
        "status": pl.String,  # RUNNING | INIT | FINALIZE | ABORT | NOCOMM (worst)
        "errors": pl.String,  # OK | MISMATCH | INCOMPLETE | ERROR, joined by ","
        "op_counts": pl.String,  # "AllReduce=10 640/641" style summary of differing counts
    }
)

#: One row per rank or process a RAS report names: missing, dead, mismatched, errored.
RAS_RANKS_SCHEMA = _schema(
    {
        "file_id": pl.UInt32,
        "comm_hash": pl.String,  # null for job-level (missing/dead process) rows
        "comm_rank": pl.Int32,
        "pid": pl.Int32,
        "host": pl.String,
        "gpu": pl.String,
        "state": pl.String,  # missing | dead | unresponsive | mismatch | status | error
        "detail": pl.String,  # e.g. "launched up to operation 640 (AllGather)"
    }
)


class SchemaMismatchError(ValueError):
    """A frame does not have the declared schema (a bug in ncclscope, not in the input)."""


def validate(df: pl.DataFrame, schema: pl.Schema, name: str) -> pl.DataFrame:
    """Return ``df`` if its columns and dtypes are exactly ``schema``; raise otherwise."""
    if df.schema != schema:
        got = dict(df.schema)
        want = dict(schema)
        diff = {
            k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)
        }
        raise SchemaMismatchError(f"table {name}: columns differ from its schema: {diff}")
    return df
