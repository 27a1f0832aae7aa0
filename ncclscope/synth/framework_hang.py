"""Framework lines of a failure (watchdog, desync report, torchrun agents); the framework truth."""

from __future__ import annotations

import math
import time
import zlib

from ncclscope.synth.faults import _OTHER_OP, _SIGNAME, ExtraCollective, Mismatch
from ncclscope.synth.framework import (
    _DESYNC_WHY,
    _ENTRYPOINT,
    _OP_TYPE,
    _PY_BINARY,
    _PY_SITE,
    _TORCH_LIB,
    _FrameworkLines,
    _numel,
    _rank_of,
    _ranks_str,
    _Rec,
)
from ncclscope.synth.options import Json
from ncclscope.synth.parts import _Rank, _Sink


class _Framework(_FrameworkLines):
    """The PyTorch/DeepSpeed side of one job: its lines and, from them, its truth.

    It draws from its own random generator, so that the NCCL side of a job is the same
    whatever the framework writes.
    """

    # ---- PyTorch: what a hang turns into ------------------------------------------------

    def _glog(self, sev: str, t: float, line: int) -> str:
        src = f"ProcessGroupNCCL.cpp:{line}"
        if not self.tf.glog_time:
            return f"[{sev} {src}]"
        sec = int(t)
        tm = time.gmtime(sec)
        ns = int((t - sec) * 1e6) * 1000 + self.rnd.randrange(1000)
        # c10's glog header: month not zero-padded ("E314" = March 14), nanoseconds.
        return (
            f"[{sev}{tm.tm_mon}{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:"
            f"{tm.tm_sec:02d}.{ns:09d} {src}]"
        )

    def _c10(self, rk: _Rank, t: float, line: int, msg: str) -> str:
        """A C++ LOG(ERROR) line of ``rk``: launcher prefix, [rankG]:, glog header, message."""
        pre = f"[rank{rk.rank}]:" if self.tf.rank_prefix else ""
        return f"{rk.head}{pre}{self._glog('E', t + self.job.rank_off[rk.rank], line)} {msg}"

    def _frames(self, rk: _Rank, bases: dict[str, int], where: str, line: int) -> list[str]:
        """``Exception raised from <where> at ...:<line>`` and its stack (c10::Error)."""
        tf = self.tf
        libc10 = f"{_TORCH_LIB}/libc10.so"
        cuda = f"{_TORCH_LIB}/libtorch_cuda.so"
        cxx = "/lib/x86_64-linux-gnu/libstdc++.so.6"
        libc = "/lib/x86_64-linux-gnu/libc.so.6"
        if where == "checkTimeout":
            stack = [
                ("c10::Error::Error(c10::SourceLocation, std::string)", 0x96, libc10, "c10"),
                (
                    "c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout("
                    f"{tf.optional}<std::chrono::duration<long, std::ratio<1l, 1000l> > >)",
                    0x1D2,
                    cuda,
                    "cuda",
                ),
                (f"c10d::ProcessGroupNCCL::{tf.loop}()", 0x233, cuda, "cuda"),
                ("c10d::ProcessGroupNCCL::ncclCommWatchdog()", 0x10C, cuda, "cuda"),
            ]
        else:
            stack = [
                ("c10::Error::Error(c10::SourceLocation, std::string)", 0x96, libc10, "c10"),
                ("<unknown function>", 0xE5AA84, cuda, "cuda"),
            ]
        stack += [
            ("<unknown function>", 0xDC253, cxx, "cxx"),
            ("<unknown function>", 0x94AC3, libc, "libc"),
            ("clone", 0x44, libc, "libc"),
        ]
        out = [
            f"{rk.head}Exception raised from {where} at "
            f"../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:{line} (most recent call first):"
        ]
        for k, (func, off, lib, key) in enumerate(stack):
            # "<unknown function> + off" is an offset into the library; a named one is an
            # offset into the function, placed at an invented (fixed) spot in the library.
            start = 0 if func == "<unknown function>" else zlib.crc32(func.encode()) & 0xFFF000
            out.append(
                f"{rk.head}frame #{k}: {func} + 0x{off:x} (0x{bases[key] + start + off:x} in {lib})"
            )
        out.append(f"{rk.head}")
        return out

    def _work(self, seq: int, op: str, nin: int, nout: int) -> str:
        t_ms = round(self.timeout_s * 1000)
        return (
            f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={nin}, NumelOut={nout}, "
            f"Timeout(ms)={t_ms})"
        )

    def _desync(
        self,
        me: int,
        seq: int,
        ops: dict[int, str],
        prev_ops: dict[int, str],
        ahead: dict[int, str],
    ) -> tuple[list[str], list[int]]:
        """TraceUtils.h ``retrieveDesyncReport`` as ``me`` sees it: its lines after the
        header line, and the ranks it names as lagging.

        ``ahead``: ranks whose last started collective is one further (an extra call), with
        its op. The report then names the others, who are behind them, as lagging.
        """
        job = self.job
        skipped = sorted(job.skipped)
        lines = [f"\t - [{me}] Timeout at collective: {ops[me]}, #{seq}"]
        if skipped and seq == 1:  # the stopped ranks never wrote a trace key
            lines.append(
                f"\t - To our best knowledge, ranks [{_ranks_str(skipped)}] are the lagging "
                "ranks that caused this timeout. They never joined any collectives"
            )
            return lines, skipped
        # seq -> rank -> (op, finished): the last collective each rank started (count from 1)
        trace: dict[int, dict[int, tuple[str, bool]]] = {}
        for r in range(job.n):
            if r in job.skipped:
                trace.setdefault(seq - 1, {})[r] = (prev_ops[r], True)
            elif r in ahead:
                trace.setdefault(seq + 1, {})[r] = (ahead[r], False)
            else:
                trace.setdefault(seq, {})[r] = (ops[r], False)
        lag = min(trace)
        started = sorted(r for r, (_, done) in trace[lag].items() if not done)
        ended = sorted(r for r, (_, done) in trace[lag].items() if done)
        lines.append(
            "\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the "
            "desync are:"
        )
        if started:
            lines.append(
                f"\t   - [{_ranks_str(started)}] joined but didn't finish collective #{lag} "
                "(count from 1)"
            )
        if ended:
            lines.append(
                f"\t     [{_ranks_str(ended)}] finished collective #{lag}, but didn't join "
                f"collective #{lag + 1} (count from 1)"
            )
        lines.append("\t - Snapshot of ranks' latest states:")
        for s in sorted(trace):
            for done, verb in ((False, "started"), (True, "finished")):
                by_op: dict[str, list[int]] = {}
                for r, (op, d) in sorted(trace[s].items()):
                    if d == done:
                        by_op.setdefault(op, []).append(r)
                if by_op:
                    lines.append(f"\t   #{s} {verb} ranks:")
                    lines += [f"\t     [{_ranks_str(by_op[o])}] {verb} {o}" for o in sorted(by_op)]
        return lines, ended or started

    def _rank_op(self, instance: int, rank: int) -> tuple[str, int]:
        """(NCCL op, count) that ``rank`` issued at world instance ``instance``."""
        job = self.job
        call = job._world_call(instance)
        op, count = call.op, call.count_of(job.n)
        for f in self.spec.faults:
            if isinstance(f, Mismatch) and f.rank == rank and f.at_instance == instance:
                if f.field == "op":
                    op = _OTHER_OP[op]
                elif f.field == "count":
                    count *= 2
            if isinstance(f, ExtraCollective) and f.rank == rank and f.at_instance == instance:
                return "AllReduce", 1  # its work at this sequence is the extra call
        return op, count

    def hang(self) -> None:
        """The job hung at world instance ``halt_at``: watchdogs fire, ranks abort, agents
        report. Written in time order through the sinks, line numbers kept for the truth."""
        job = self.job
        n = job.n
        halt = job.halt_at
        seq = halt + 1  # SeqNum: collectives this rank issued on the world PG, from 1
        waiting = [r for r in range(n) if r not in job.skipped]
        if not waiting and not job.dead_at_halt:
            return
        tf = self.tf
        r_ = self.rnd
        ops = {r: _OP_TYPE[self._rank_op(halt, r)[0]] for r in waiting}
        prev_ops = {r: _OP_TYPE[self._rank_op(halt - 1, r)[0]] for r in job.skipped if halt >= 1}
        # An extra-calling rank has enqueued its real call too: one work further.
        ahead = {r: _OP_TYPE[job._world_call(halt).op] for r in job.extra_at_halt}
        comp = seq - 1 if seq > 1 else -1
        recs: list[_Rec] = []
        exits: dict[int, float] = {}
        codes: dict[int, int] = {}  # exit code of each exit other than the watchdog's -6
        lagging: list[int] = []  # the ranks every desync report names
        for r in waiting:
            rk = job.ranks[r]
            sink = job.rank_sink[r]
            enq = seq + 1 if r in ahead else seq
            op, count = self._rank_op(halt, r)
            nin, nout = _numel(op, count, n)
            ran = round(self.timeout_s * 1000) + r_.randint(3, 99)
            t = job.halt_times[r] + ran / 1000.0
            pg = tf.pg_prefix.format(r=r)
            wd = (
                f"[Rank {r}] Watchdog caught collective operation timeout: "
                f"{self._work(seq, ops[r], nin, nout)} ran for {ran} milliseconds before "
                "timing out."
            )
            entry: dict[str, Json] = {
                "rank": r,
                "global_rank": r,
                "host": rk.host,
                "pid": rk.pid,
                "seq": seq,
                "op": ops[r],
                "numel_in": nin,
                "numel_out": nout,
                "timeout_s": self.timeout_s,
                "ran_for_ms": ran,
                "last_enqueued": enq,
                "last_completed": comp,
            }
            watchdog = [self._c10(rk, t, tf.wd, wd)]
            if tf.exc_det is not None:
                watchdog.append(
                    self._c10(
                        rk,
                        t + 0.0002,
                        tf.exc_det,
                        f"{pg} Exception (either an error or timeout) detected by watchdog at "
                        f"work: {seq}, last enqueued NCCL work: {enq}, last completed NCCL "
                        f"work: {comp}.",
                    )
                )
            if tf.to_at is not None:
                watchdog.append(
                    self._c10(
                        rk,
                        t + 0.0003,
                        tf.to_at,
                        f"{pg} Timeout at NCCL work: {seq}, last enqueued NCCL work: {enq}, "
                        f"last completed NCCL work: {comp}.",
                    )
                )
            if tf.fail_det is not None and tf.dump is not None:
                watchdog += [
                    self._c10(
                        rk,
                        t + 0.0002,
                        tf.fail_det,
                        f"{pg}  failure detected by watchdog at work sequence id: {seq} PG "
                        f"status: last enqueued work: {enq}, last completed work: {comp}",
                    ),
                    self._c10(
                        rk,
                        t + 0.0003,
                        tf.dump[0],
                        "Stack trace of the failed collective not found, potentially because "
                        "FlightRecorder is disabled. You can enable it by setting "
                        "TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.",
                    ),
                ]
            recs.append(_Rec(t, len(recs), sink, watchdog, [(0, self.timeouts, entry)], r))
            t_next = t + 0.0005
            if self.spec.desync_report:
                report, lagging = self._desync(r, seq, ops, prev_ops, ahead)
                # LOG(ERROR) << [logPrefix() <<] report: the report starts with "\n", so
                # the header line ends in a space.
                head = f"{pg} " if tf.desync_prefixed else ""
                lines = [self._c10(rk, t_next, tf.desync, head), *(rk.head + x for x in report)]
                recs.append(_Rec(t_next, len(recs), sink, lines, owner=r, desync=True))
                t_next += 0.05  # the report reads every rank's key from the store
            if tf.dump is not None:
                recs.append(
                    _Rec(
                        t_next,
                        len(recs),
                        sink,
                        [
                            self._c10(
                                rk,
                                t_next,
                                tf.dump[1],
                                f"{pg} First PG on this rank to signal dumping.",
                            )
                        ],
                        owner=r,
                    )
                )
                t_mon = t_next + r_.uniform(0.005, 0.5)  # the heartbeat monitor thread
                recs.append(
                    _Rec(
                        t_mon,
                        len(recs),
                        sink,
                        [
                            self._c10(
                                rk,
                                t_mon,
                                tf.dump[2],
                                f"{pg} Received a dump signal due to a collective timeout from "
                                "this local rank and we will try our best to dump the debug "
                                f"info. Last enqueued NCCL work: {enq}, last completed NCCL "
                                f"work: {comp}.{_DESYNC_WHY}",
                            ),
                            self._c10(
                                rk,
                                t_mon + 0.0001,
                                tf.dump[3],
                                f"{pg} ProcessGroupNCCL preparing to dump debug info. Include "
                                "stack trace: 1",
                            ),
                        ],
                        owner=r,
                    )
                )
            rank_pre = f"[Rank {r}] " if tf.some_prefixed else ""
            t_some = t_next + r_.uniform(*tf.term_delay)
            recs.append(
                _Rec(
                    t_some,
                    len(recs),
                    sink,
                    [
                        self._c10(
                            rk,
                            t_some,
                            tf.some,
                            f"{rank_pre}Some NCCL operations have failed or timed out. Due to "
                            "the asynchronous nature of CUDA kernels, subsequent GPU operations "
                            "might run on corrupted/incomplete data.",
                        ),
                        self._c10(
                            rk,
                            t_some + 0.0001,
                            tf.avoid,
                            f"{rank_pre}To avoid data inconsistency, we are taking the entire "
                            "process down.",
                        ),
                    ],
                    owner=r,
                )
            )
            bases = {
                "c10": 0x7F0000000000 + r_.getrandbits(28) * 0x1000,
                "cuda": 0x7F0000000000 + r_.getrandbits(28) * 0x1000,
                "cxx": 0x7F0000000000 + r_.getrandbits(28) * 0x1000,
                "libc": 0x7F0000000000 + r_.getrandbits(28) * 0x1000,
            }
            term = (f"{pg} " if tf.term_pg_prefixed else f"[Rank {r}] ") + tf.term_msg + wd
            t_term = t_some + 0.001
            ct = self._frames(rk, bases, "checkTimeout", tf.check_timeout)
            nw = self._frames(rk, bases, "ncclCommWatchdog", tf.comm_watchdog)
            lines = [self._c10(rk, t_term, tf.term, term), *ct]
            lines += [
                f"{rk.head}terminate called after throwing an instance of 'c10::DistBackendError'",
                f"{rk.head}  what():  {term}",
                *ct,
                *nw,
            ]
            recs.append(_Rec(t_term, len(recs), sink, lines, owner=r))
            exits[r] = t_term + r_.uniform(0.05, 0.3)  # SIGABRT
        for r, dead in job.dead_at_halt.items():  # died before the collective: no line
            exits[r] = job.death_times[r]
            codes[r] = dead.exit_code
        kills = self._agents(exits, recs, codes)
        # SIGTERM ends a process at once (no handler in the workers): nothing after it.
        recs = [rec for rec in recs if rec.t <= kills.get(rec.owner, math.inf)]
        if any(rec.desync for rec in recs):
            self.desync_lagging = lagging
        job._flush_all()
        recs.sort(key=lambda rec: (rec.t, rec.order))
        for rec in recs:
            sink = rec.sink
            base = sink.lines + sink.pending_lines()
            for off, dest, entry in rec.marks:
                entry["path"] = sink.rel
                entry["line_no"] = base + off + 1
                dest.append(entry)
            sink.add("".join(f"{line}\n" for line in rec.lines))
            self.lines += len(rec.lines)
            job._touch(rec.t)
        self.timeouts.sort(key=_rank_of)
        self.failures.sort(key=_rank_of)

    def _agent_head(self, sev: str, t: float, pid: int, line: int) -> str:
        sec = int(t)
        ms = int((t - sec) * 1000)
        tm = time.gmtime(sec)
        if self.tf.agent_glog:  # torch's Python glog format (>= 2.4): month zero-padded
            return (
                f"{sev}{tm.tm_mon:02d}{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:"
                f"{tm.tm_sec:02d}.{ms:03d}000 {pid} "
                f"torch/distributed/elastic/multiprocessing/api.py:{line}] "
            )
        level = {"W": "WARNING", "E": "ERROR"}[sev]
        return (
            f"[{self.ds_sec.get(sec)},{ms:03d}] torch.distributed.elastic.multiprocessing.api: "
            f"[{level}] "
        )

    def _agents(
        self, exits: dict[int, float], recs: list[_Rec], codes: dict[int, int]
    ) -> dict[int, float]:
        """Each host's torchrun agent: SIGTERM to what still runs, then ChildFailedError.

        ``exits``: when each exiting rank's process ended; ``codes``: its exit code where it
        is not the watchdog's SIGABRT (-6). Returns when each SIGTERMed rank was killed.
        """
        kills: dict[int, float] = {}
        job = self.job
        tf = self.tf
        r_ = self.rnd
        used = {rk.pid for rk in job.ranks}
        for h in range(self.spec.hosts):
            members = job.ranks[h * job.rph : (h + 1) * job.rph]
            dead = [rk for rk in members if rk.rank in exits]
            if not dead:  # nothing on this host exited: its agent has nothing to report
                continue
            # The agent polls every monitor interval; what has exited by then has failed.
            t_poll = min(exits[rk.rank] for rk in dead) + r_.uniform(0.0, tf.monitor_interval_s)
            failed = [rk for rk in dead if exits[rk.rank] <= t_poll]
            alive = [rk for rk in members if rk not in failed]
            # One poll stamps every failure alike, so min(timestamp) is the first one
            # inserted: the lowest local rank.
            root = failed[0]
            pid = r_.randrange(10000, 999999)
            while pid in used:
                pid = r_.randrange(10000, 999999)
            used.add(pid)
            host = members[0].host
            if job.combined:
                sink = job.sinks[0]
                head = f"{host}: " if self.spec.launcher == "pdsh" else ""
            else:
                rel = f"{host}.{pid}.log"
                sink = _Sink(job.out_dir / rel, rel)
                job.sinks.append(sink)
                head = ""
            off = job.host_off[h]  # the agent prints with its host's clock
            lines = [
                f"{head}{self._agent_head('W', t_poll + off, pid, tf.agent_sigterm)}"
                f"Sending process {rk.pid} closing signal SIGTERM"
                for rk in alive
            ]
            if lines:
                recs.append(_Rec(t_poll, len(recs), sink, lines))
            self.terminated += [rk.rank for rk in alive]
            kills.update((rk.rank, t_poll) for rk in alive)
            t_fail = t_poll + r_.uniform(0.2, 1.5)  # after the SIGTERMed ones are gone
            recs.append(
                _Rec(
                    t_fail,
                    len(recs),
                    sink,
                    [
                        f"{head}{self._agent_head('E', t_fail + off, pid, tf.agent_failed)}failed "
                        f"(exitcode: {codes.get(root.rank, -6)}) local_rank: {root.local} "
                        f"(pid: {root.pid}) of binary: {_PY_BINARY}"
                    ],
                )
            )
            block, marks = self._child_failed(failed, root, t_poll + off, codes)
            t_block = t_fail + 0.002
            recs.append(
                _Rec(
                    t_block,
                    len(recs),
                    sink,
                    [f"{head}{x}" for x in block],
                    [(off, self.failures, entry) for off, entry in marks],
                )
            )
        self.terminated.sort()
        return kills

    def _child_failed(
        self, failed: list[_Rank], root: _Rank, t_printed: float, codes: dict[int, int]
    ) -> tuple[list[str], list[tuple[int, dict[str, Json]]]]:
        """torchrun's traceback and ChildFailedError block (errors/__init__.py templates);
        ``t_printed`` is the agent's poll time on its host's clock."""
        a, b, c, d, e = self.tf.tb_lines
        dist = f"{_PY_SITE}/torch/distributed"
        lines = [
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/torchrun", line 8, in <module>',
            "    sys.exit(main())",
            f'  File "{dist}/elastic/multiprocessing/errors/__init__.py", line {a}, in wrapper',
            "    return f(*args, **kwargs)",
            f'  File "{dist}/run.py", line {b}, in main',
            "    run(args)",
            f'  File "{dist}/run.py", line {c}, in run',
            "    elastic_launch(",
            f'  File "{dist}/launcher/api.py", line {d}, in __call__',
            "    return launch_agent(self._config, self._entrypoint, list(args))",
            f'  File "{dist}/launcher/api.py", line {e}, in launch_agent',
            "    raise ChildFailedError(",
            # The message starts with "\n": the class name line ends in ": ".
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        ]
        stamp = time.strftime("%Y-%m-%d_%H:%M:%S", time.gmtime(int(t_printed)))
        fmts: dict[int, list[str]] = {}
        for idx, rk in enumerate(failed):  # [idx] is the failure's index, not its rank
            code = codes.get(rk.rank, -6)
            fmts[rk.rank] = [
                f"[{idx}]:",
                f"  time      : {stamp}",
                f"  host      : {rk.host}",
                f"  rank      : {rk.rank} (local_rank: {rk.local})",
                f"  exitcode  : {code} (pid: {rk.pid})",
                "  error_file: <N/A>",
                f"  traceback : Signal {-code} ({_SIGNAME[-code]}) received by PID {rk.pid}",
            ]
        title = f"{_ENTRYPOINT} FAILED"
        width = min(max(len(title), *(len(x) for f in fmts.values() for x in f)), 60)
        lines += ["=" * width, title, "-" * width, "Failures:"]
        marks: list[tuple[int, dict[str, Json]]] = []

        def entry(rk: _Rank) -> dict[str, Json]:
            code = codes.get(rk.rank, -6)
            return {
                "rank": rk.rank,
                "local_rank": rk.local,
                "host": rk.host,
                "pid": rk.pid,
                "exitcode": code,
                "signal": _SIGNAME[-code],
                "root_cause": rk is root,
            }

        others = [rk for rk in failed if rk is not root]
        for rk in others:
            marks.append((len(lines), entry(rk)))
            lines += fmts[rk.rank]
        if not others:
            lines.append("  <NO_OTHER_FAILURES>")
        lines += ["-" * width, "Root Cause (first observed failure):"]
        marks.append((len(lines), entry(root)))
        lines += fmts[root.rank]
        lines.append("=" * width)
        return lines, marks

    # ---- truth ------------------------------------------------------------------------

    def truth(self) -> dict[str, Json]:
        """What the framework wrote (``truth.json`` key ``framework``).

        ``name``, ``torch_era``, ``torch_version``; DeepSpeed only: ``deepspeed_version``,
        ``zero`` (stage, offload_optimizer/offload_param "cpu"|"none", overlap_comm,
        reduce_bucket_size, allgather_bucket_size), ``steps_per_print``,
        ``train_batch_size``. Then ``timeout_s``; ``lines`` (framework lines written);
        ``timer_lines`` (values written per timer, >= 0.10.1 names); ``straggler_ms_per_step``
        (what the slowest rank's lateness adds to each timer per step);
        ``throughput_steps``; ``memory_reports`` (as printed); ``comms_summary`` rows;
        ``timeouts`` (one per watchdog line written, with its file and line); ``failures``
        (one per ChildFailedError entry, line of its ``[idx]:``); ``terminated`` (ranks
        SIGTERMed by their agent); ``desync_lagging`` (ranks the desync reports name).
        """
        spec = self.spec
        out: dict[str, Json] = {
            "name": spec.framework,
            "torch_era": spec.torch_era,
            "torch_version": self.tf.version,
        }
        if self.ds:
            out["deepspeed_version"] = self.df.version
            out["zero"] = {
                "stage": self.stage,
                "offload_optimizer": "cpu" if self.off_opt else "none",
                "offload_param": "cpu" if self.off_param else "none",
                "overlap_comm": self.overlap,
                "reduce_bucket_size": self.reduce_bucket,
                "allgather_bucket_size": self.allgather_bucket,
            }
            out["steps_per_print"] = spec.steps_per_print
            out["train_batch_size"] = self.batch
        out["timeout_s"] = self.timeout_s
        out["lines"] = self.lines
        out["timer_lines"] = dict(sorted(self.timer_lines.items()))
        straggler: dict[str, Json] = {}
        if self.ds:
            late_ms = self.lateness * 1000.0
            for name in sorted(self.timer_lines):
                base = name.removesuffix("_microstep")
                slots = (
                    self.wait_slots["bwd_inner"] + self.wait_slots["bwd_allreduce"]
                    if base == "bwd"
                    else self.wait_slots.get(base, 0)
                )
                straggler[name] = round(slots * late_ms, 6)
        out["straggler_ms_per_step"] = straggler
        out["throughput_steps"] = list(self.throughput_steps)
        out["memory_reports"] = list(self.memory_reports)
        out["comms_summary"] = list(self.comms_rows)
        out["timeouts"] = list(self.timeouts)
        out["failures"] = list(self.failures)
        out["terminated"] = list(self.terminated)
        out["desync_lagging"] = list(self.desync_lagging)
        return out
