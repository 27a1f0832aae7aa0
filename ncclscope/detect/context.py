"""Tables several detectors share, computed once per run from the collectives table.

The collectives table of a 1 GiB log has millions of rows and lives in Parquet; every
pass over it costs a few tenths of a second.  A healthy log gets two: one streaming
group-by per communicator member (``progress``), and a read of every ``stride``-th
collective instance (``sample``), from which per-instance arrival times and lateness are
measured.  Reads that a finding needs (a culprit's last calls, a mismatched instance)
filter on the sequence, which polars pushes into the Parquet scan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING

import polars as pl

from ncclscope.model.collectives import P2P_OPS
from ncclscope.model.identity import ANCHORED
from ncclscope.schema import INSTANCES_SCHEMA, PROGRESS_SCHEMA

if TYPE_CHECKING:
    from ncclscope.findings import Finding
    from ncclscope.model import Analysis

__all__ = ["SAMPLE_ROWS", "Context", "progress_table"]

#: COLL lines read for timing: enough instances for stable medians on any job, a bounded
#: cost on a large one.
SAMPLE_ROWS = 400_000

_SAMPLE_COLUMNS = ("comm_key", "comm_rank", "rank", "host", "seq", "op", "ts", "file_id", "line_no")


@dataclass
class Context:
    """One analysis and the shared tables the detectors read."""

    analysis: Analysis
    #: The wall clock of a live reading (the agent's window); None post-mortem.  Where
    #: set, "no progress since" is measured to it rather than to the last line: a live
    #: job that stopped logging has been idle for as long as the clock has run since.
    now: datetime | None = field(default=None, kw_only=True)
    #: The findings of the detectors that ran before the one now running, in run order
    #: (``run_context`` fills it): a detector that explains others' findings (``fabric``:
    #: the cluster's counters behind a slow node, a hang, an error) reads them here.
    found: list[Finding] = field(default_factory=list, kw_only=True)

    def collectives(self) -> pl.LazyFrame | None:
        """Every collective call (P2P left out) with a known communicator, lazily."""
        coll = self.analysis.collectives
        if coll is None:
            return None
        return coll.filter(~pl.col("op").is_in(P2P_OPS) & pl.col("comm_key").is_not_null())

    @cached_property
    def progress(self) -> pl.DataFrame:
        """Per (communicator, member): calls, the last sequence reached, its last line
        and the signature of its calls (``PROGRESS_SCHEMA``).  Read off the per-process
        statistics the analysis already holds: no pass over the collectives."""
        return progress_table(self.analysis.stats, self.analysis.identity.members)

    @property
    def ranks_without_logs(self) -> frozenset[int]:
        """Ranks of the world that left no line in these inputs (their host's files are
        absent, or the excerpt left them out); empty when unknown.  A detector must not
        blame one of them on its silence alone: only on evidence from the others (a
        watchdog naming it, a desync report, the launcher's failure summary)."""
        missing = self.analysis.ranks_without_logs
        return frozenset(missing) if missing else frozenset()

    @property
    def followed_by(self) -> list[str] | None:
        """When the inputs hold several runs and the detectors are on one that a later
        run followed: why the next one started (``restart``: the launcher restarted the
        workers; ``banner``/``init``/``pids``: new processes).  The job stopped there:
        evidence that this run's last collectives did not complete.  None otherwise."""
        return self.analysis.followed_by

    @cached_property
    def file_ends(self) -> dict[int, datetime]:
        """Per input file: the latest time any record of it carries (NCCL lines, PyTorch
        and launcher lines, timers, errors).  Files without a timed record are absent."""
        a = self.analysis
        fw = a.frameworks
        frames = [
            t.select("file_id", "ts")
            for t in (fw.timeouts, fw.torch_events, fw.failures, fw.timers, a.errors)
            if "ts" in t.columns and "file_id" in t.columns
        ]
        if "ts_max" in a.stats.columns:
            frames.append(a.stats.select("file_id", pl.col("ts_max").alias("ts")))
        ends: dict[int, datetime] = {}
        for frame in frames:
            per = (
                frame.cast({"file_id": pl.UInt32, "ts": pl.Datetime("us", "UTC")})
                .drop_nulls()
                .group_by("file_id")
                .agg(pl.col("ts").max())
            )
            for fid, ts in per.iter_rows():
                if isinstance(ts, datetime) and (fid not in ends or ts > ends[fid]):
                    ends[int(fid)] = ts
        return ends

    @cached_property
    def processes_per_file(self) -> dict[int, int]:
        """Per input file: how many processes (host, pid) logged NCCL lines in it."""
        stats = self.analysis.stats
        if stats.is_empty():
            return {}
        per = stats.group_by("file_id").agg(pl.struct("host", "pid").n_unique().alias("n"))
        return {int(f): int(n) for f, n in per.iter_rows()}

    def files_of(self, rank: int, group_size: int | None = None) -> set[int]:
        """The input files holding lines of global rank ``rank``: its NCCL lines (as a
        member of any communicator) or its ``[rankN]:``-prefixed PyTorch lines, or a
        stream that holds every rank of its host or of the job (``group_size``: the size
        of the group it belongs to, where the world's is not known)."""
        a = self.analysis
        fw = a.frameworks
        out = set(
            a.identity.members.filter(pl.col("rank") == rank)["file_id"].drop_nulls().to_list()
        )
        for t in (fw.timeouts, fw.torch_events):
            out |= set(t.filter(pl.col("global_rank") == rank)["file_id"].to_list())
        # Where its own lines are unknown (init lines cut away, and it printed no
        # report): a host's combined stream (torchrun's stdout, several ranks' lines in
        # one file) holds every rank of that host, and the launcher's summary says which
        # host ran it.
        hosts = set(a.identity.members.filter(pl.col("rank") == rank)["host"].drop_nulls())
        hosts |= set(fw.failures.filter(pl.col("rank") == rank)["host"].drop_nulls())
        for host in hosts:
            out |= self._combined_files(str(host))
        out |= self._spanning_files(rank)
        if not hosts:
            # Host unknown too: a job-wide stream (the lines of several hosts in one
            # file: a launcher's or scheduler's combined output) holds every rank's.
            out |= self._job_wide_files(group_size)
        return {int(f) for f in out}

    def _spanning_files(self, rank: int) -> set[int]:
        """Files holding lines of ranks below and above ``rank``: launchers give each node
        a contiguous block of global ranks (node_rank x local ranks + local_rank), so a
        stream holding ranks 0, 1, 2, 4 and 5 of one node holds rank 3's too."""
        a = self.analysis
        fw = a.frameworks
        parts = [a.identity.members.select("file_id", "rank")] + [
            t.select("file_id", pl.col("global_rank").alias("rank"))
            for t in (fw.timeouts, fw.torch_events)
        ]
        rows = pl.concat([p.cast({"file_id": pl.UInt32, "rank": pl.Int32}) for p in parts])
        per = (
            rows.drop_nulls()
            .group_by("file_id")
            .agg(
                (pl.col("rank") < rank).any().alias("below"),
                (pl.col("rank") > rank).any().alias("above"),
            )
        )
        return {int(f) for f in per.filter(pl.col("below") & pl.col("above"))["file_id"]}

    def _job_wide_files(self, group_size: int | None) -> set[int]:
        """Files holding the lines of two or more hosts; or, where no line of a file
        names its host, the lines of more than half the world's ranks (one host's
        stream holds its own ranks only, rarely most of the job's)."""
        a = self.analysis
        fw = a.frameworks
        parts = [
            t.select("file_id", "host", pl.col(col).alias("rank"))
            for t, col in (
                (a.identity.members, "rank"),
                (fw.timeouts, "global_rank"),
                (fw.torch_events, "global_rank"),
                (fw.failures, "rank"),
                (a.errors, "rank"),
            )
        ]
        rows = pl.concat(
            [p.cast({"file_id": pl.UInt32, "host": pl.String, "rank": pl.Int32}) for p in parts]
        )
        per = rows.group_by("file_id").agg(
            pl.col("host").drop_nulls().n_unique().alias("hosts"),
            pl.col("rank").drop_nulls().n_unique().alias("ranks"),
        )
        world = a.world_size or a.identity.world_size or fw.world_size or group_size
        most = (pl.col("ranks") * 2 > world) if world else pl.lit(value=False)
        wide = per.filter((pl.col("hosts") >= 2) | ((pl.col("hosts") == 0) & most))
        return {int(f) for f in wide["file_id"].to_list()}

    @cached_property
    def ranks_named_per_file(self) -> dict[int, frozenset[int]]:
        """Per input file: the global ranks its lines name (NCCL members whose rank is
        known, PyTorch's ``[rankN]:`` prefixes)."""
        a = self.analysis
        fw = a.frameworks
        parts = [
            a.identity.members.select("file_id", "rank"),
            *(
                t.select("file_id", pl.col("global_rank").alias("rank"))
                for t in (fw.timeouts, fw.torch_events)
            ),
        ]
        rows = pl.concat([p.cast({"file_id": pl.UInt32, "rank": pl.Int32}) for p in parts])
        per = rows.drop_nulls().group_by("file_id").agg(pl.col("rank").unique())
        return {int(f): frozenset(int(r) for r in rs) for f, rs in per.iter_rows()}

    def _combined_files(self, host: str) -> set[int]:
        """Files holding the lines of two or more ranks of ``host``."""
        a = self.analysis
        fw = a.frameworks
        parts = [
            a.identity.members.select("file_id", "host", "rank"),
            *(
                t.select("file_id", "host", pl.col("global_rank").alias("rank"))
                for t in (fw.timeouts, fw.torch_events)
            ),
        ]
        rows = pl.concat(
            [p.cast({"file_id": pl.UInt32, "host": pl.String, "rank": pl.Int32}) for p in parts]
        ).filter((pl.col("host") == host) & pl.col("rank").is_not_null())
        per = rows.group_by("file_id").agg(pl.col("rank").n_unique().alias("ranks"))
        return {int(f) for f in per.filter(pl.col("ranks") >= 2)["file_id"].to_list()}

    @cached_property
    def stride(self) -> int:
        """Every ``stride``-th sequence number is sampled."""
        summary = self.analysis.summary
        calls = summary.calls if summary is not None else 0
        return max(1, math.ceil(calls / SAMPLE_ROWS))

    @cached_property
    def sample(self) -> pl.DataFrame:
        """The calls at every ``stride``-th sequence of each communicator."""
        coll = self.collectives()
        if coll is None:
            return pl.DataFrame()
        picked = coll if self.stride == 1 else coll.filter(pl.col("seq") % self.stride == 0)
        return picked.select(_SAMPLE_COLUMNS).collect(engine="streaming")

    @cached_property
    def instances(self) -> pl.DataFrame:
        """Per sampled collective instance: members that logged it and their first and
        last arrival times (``INSTANCES_SCHEMA``)."""
        if self.sample.is_empty():
            return pl.DataFrame(schema=INSTANCES_SCHEMA)
        return (
            self.sample.group_by("comm_key", "seq")
            .agg(
                pl.len().alias("n"),
                pl.col("ts").min().alias("ts_min"),
                pl.col("ts").max().alias("ts_max"),
                pl.col("ts").is_not_null().sum().alias("with_ts"),
            )
            .select(list(INSTANCES_SCHEMA))
            .cast(INSTANCES_SCHEMA)
            .sort("comm_key", "seq")
        )

    def rows_at(self, comm_key: str, seqs: list[int]) -> pl.DataFrame:
        """Every member's call at these sequences of one communicator."""
        coll = self.collectives()
        if coll is None or not seqs:
            return pl.DataFrame()
        return (
            coll.filter(
                (pl.col("comm_key") == comm_key)
                & pl.col("seq").is_in(pl.Series(seqs, dtype=pl.Int64).implode())
            )
            .collect(engine="streaming")
            .sort("seq", "comm_rank")
        )

    def mixed_seqs(self, comm_key: str, limit: int) -> list[int]:
        """The first sequences of a communicator at which its members logged different
        ops, counts or datatypes: a full pass over that communicator's calls, made only
        when the members' signatures disagree."""
        coll = self.collectives()
        if coll is None:
            return []
        mixed = (
            coll.filter(pl.col("comm_key") == comm_key)
            .group_by("seq")
            .agg(
                (pl.col("op").min() != pl.col("op").max())
                | (pl.col("count").min() != pl.col("count").max())
                | (pl.col("dtype").min() != pl.col("dtype").max())
            )
            .collect(engine="streaming")
        )
        flag = mixed.columns[1]
        return sorted(mixed.filter(pl.col(flag))["seq"].to_list())[:limit]

    @cached_property
    def telemetry(self) -> pl.DataFrame:
        """The agent's samples with each host spelled as the logs spell it
        (``ncclscope.hosts.with_log_hosts``): compare these with log hosts, never the raw
        ``analysis.telemetry``."""
        from ncclscope.hosts import with_log_hosts

        return with_log_hosts(self.analysis.telemetry, self.analysis.hosts)

    @cached_property
    def timeline(self) -> pl.DataFrame:
        """Per rank, step and phase (``STEPS_SCHEMA``; ``ncclscope.model.timeline``)."""
        from ncclscope.model.timeline import step_timeline

        return step_timeline(self.analysis)

    @cached_property
    def gpu_samples(self) -> pl.DataFrame:
        """The GPU telemetry, wide, with each GPU's rank (``timeline.gpu_samples``)."""
        from ncclscope.model.timeline import gpu_samples

        return gpu_samples(self.analysis)

    @cached_property
    def phase_samples(self) -> pl.DataFrame:
        """The GPU samples inside a phase of their rank, with its step and phase."""
        from ncclscope.model.timeline import phase_samples

        return phase_samples(self.timeline, self.gpu_samples)

    @cached_property
    def members(self) -> pl.DataFrame:
        """Per communicator: every member whose rank in it is known, by comm rank, with
        ``anchored`` (its lines start with the communicator: ``identity.ANCHORED``) and
        how it left the communicator (``ended``: Destroy, Abort or null)."""
        m = self.analysis.identity.members
        return (
            m.filter(pl.col("comm_rank").is_not_null())
            .with_columns(ANCHORED.alias("anchored"))
            .group_by("comm_key", "comm_rank")
            .agg(
                pl.col("rank", "host", "file_id", "line_no").first(),
                pl.col("anchored").any(),
                pl.col("ended").drop_nulls().first(),
            )
            .sort("comm_key", "comm_rank")
        )

    @cached_property
    def last_ts(self) -> datetime | None:
        """The latest time any line of the logs carries ("the end of the logs")."""
        a = self.analysis
        fw = a.frameworks
        latest = None
        if a.summary is not None and a.summary.with_ts:
            coll = self.collectives()
            if coll is not None:
                # The latest call of each communicator is at its highest sequence; the
                # filter on the sequence is pushed into the Parquet scan.
                top = self.progress.group_by("comm_key").agg(pl.col("last_seq").max())
                tops = pl.Series(top["last_seq"].unique(), dtype=pl.Int64).implode()
                latest = (
                    coll.filter(pl.col("seq").is_in(tops))
                    .join(
                        top.lazy(),
                        left_on=["comm_key", "seq"],
                        right_on=["comm_key", "last_seq"],
                        how="semi",
                    )
                    .select(pl.col("ts").max())
                    .collect(engine="streaming")
                    .item()
                )
        candidates = [
            latest,
            a.errors["ts"].max(),
            fw.timeouts["ts"].max(),
            fw.failures["ts"].max(),
            fw.torch_events["ts"].max(),
            fw.timers["ts"].max(),
        ]
        times = [t for t in candidates if isinstance(t, datetime)]
        return max(times) if times else None


def progress_table(stats: pl.DataFrame, members: pl.DataFrame) -> pl.DataFrame:
    """``Context.progress`` from per-process statistics (``proc_comm_stats``: calls,
    opCount range, collective calls, last opCount and line, signature per file, host,
    pid and comm pointer) and the identity's members.  The agent's live progress
    (``agent.progress``) keeps the same statistics line by line and calls this too, so
    that live and post-mortem read members' progress by one rule."""
    if stats.is_empty() or members.is_empty():
        return pl.DataFrame(schema=PROGRESS_SCHEMA)
    # Where opCount never changes (2.27+ single node), calls are counted in order:
    # a sequence only where the member's lines start with its communicator.  One
    # named by its teardown line alone may have lost its first calls with the log's
    # head (``identity.ANCHORED``): unless its own opCount counts, it is left out
    # (one call says nothing: opCount 0 may be 2.27's constant).
    counted = (pl.col("opcount_min") == pl.col("opcount_max")) & (pl.col("calls") > 1)
    key = ["file_id", "host", "pid", "comm"]
    return (
        stats.filter(pl.col("coll_calls") > 0)
        .join(
            members.select(*key, "comm_key", "comm_rank", "rank", ANCHORED.alias("anchored")),
            on=key,
            how="inner",
        )
        .filter(
            pl.col("comm_key").is_not_null()
            & pl.col("comm_rank").is_not_null()
            & (pl.col("anchored") | (pl.col("opcount_min") != pl.col("opcount_max")))
        )
        .select(
            "comm_key",
            "comm_rank",
            "rank",
            "host",
            pl.col("coll_calls").alias("calls"),
            pl.when(counted)
            .then(pl.col("calls") - 1)
            .otherwise(pl.col("coll_opcount_max"))
            .alias("last_seq"),
            "file_id",
            pl.col("last_line").alias("line_no"),
            "signature",
        )
        .cast(PROGRESS_SCHEMA)
        .unique(["comm_key", "comm_rank"], keep="first", maintain_order=True)
        .sort("comm_key", "comm_rank")
    )
