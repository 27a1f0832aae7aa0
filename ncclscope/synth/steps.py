"""Writing a job out: output plumbing, the step loop, delays, halts and the IB error."""

from __future__ import annotations

import math

from ncclscope.synth.eras import _ASYNC_EVENT
from ncclscope.synth.faults import _OTHER_OP, IbError, Mismatch, SlowHost, _other_dtype
from ncclscope.synth.nccl_lines import _JobLines
from ncclscope.synth.options import _BF16, _FLUSH_CHARS, _FP32, _JITTER_S, _OP_SUM
from ncclscope.synth.parts import _N_NICS, _Call, _IbInfo, _Rank, _subsec_226, _WarnPlan
from ncclscope.synth.truth import BenignWarnRecord

#: A slow node's compute before a collective, as a share of the slot's, by the
#: collective's phase (``SlowHost(by_phase=True)``): a backward layer costs about twice a
#: forward one; the gradient norm's all-reduce follows little compute.
_PHASE_COMPUTE = {"fwd": 1.0, "bwd": 2.0, "reduce": 2.0, "norm": 0.1, "optim_ag": 1.0}


class _JobSteps(_JobLines):
    """Output plumbing and the step loop of a job."""

    # ---- benign WARNs -----------------------------------------------------------------

    def _slots_to_run(self) -> int:
        """Collective slots (positions of the step program) the steps phase will enter."""
        n_prog = len(self.prog)
        if self.halt_at >= 0:  # the job stops in the slot of world instance halt_at
            world_pos = [j for j, call in enumerate(self.prog) if call.world]
            step, k = divmod(self.halt_at, len(world_pos))
            return step * n_prog + world_pos[k] + 1
        return self.spec.steps * n_prog

    def _warn_plan(self, written: int) -> _WarnPlan:
        """Spread ``benign_warns`` evenly: the i-th falls due at (i + 1/2) / N of the run."""
        n = self.spec.benign_warns
        target = self.spec.target_size_bytes
        if n == 0:
            return _WarnPlan([], by_bytes=False)
        if target is not None and self.halt_at < 0:
            # Unknown number of steps: spread over the bytes the steps phase will write.
            span = max(target - written, 0)
            return _WarnPlan([written + (i + 0.5) * span / n for i in range(n)], by_bytes=True)
        slots = self._slots_to_run()
        # floor((i + 1/2) * slots / n) <= slots - 1: all fall due before the last slot runs.
        return _WarnPlan([math.floor((i + 0.5) * slots / n) for i in range(n)], by_bytes=False)

    def _benign_warns(self, count: int, t: float) -> int:
        """Write ``count`` benign WARNs from time ``t`` on; return the characters added."""
        era = self.era
        added = 0
        for _ in range(count):
            rk = self.ranks[self.warn_rnd.randrange(self.n)]
            nic = rk.local * _N_NICS // self.rph
            # The NIC's "NCCL IbAsync" thread: started by ncclIbInit at network set-up, so
            # before the proxy thread. It never sets a CUDA device, hence "[0]".
            tid = rk.pid + 9 + rk.pid % 7 + nic
            msg = era.async_warn.format(hca=f"mlx5_{nic}", port=1, event=_ASYNC_EVENT)
            text = self._warn(rk, t, era.async_src, msg, tid=tid, dev=0)
            sink = self.rank_sink[rk.rank]
            line_no = sink.lines + sink.pending_lines() + 2  # after the empty line
            sink.add(text)
            self._touch(t)
            self.benign.append(
                BenignWarnRecord(
                    rank=rk.rank,
                    host=rk.host,
                    pid=rk.pid,
                    tid=tid,
                    path=sink.rel,
                    line_no=line_no,
                    warn_src=era.async_src,
                    message=msg,
                )
            )
            added += len(text)
            t += 0.0001
        return added

    # ---- one-off delays ---------------------------------------------------------------

    def _delay_slot(
        self, times: list[float], delayed: list[tuple[int, float]], call: _Call
    ) -> float:
        """Delay these ranks' enqueue times; return how much later everything after starts.

        The collective completes when its last member arrives: a delayed rank that arrives
        after where the slowest straggler would have been holds everyone up by the excess.
        """
        late = self.late
        max_late = max(late)
        push = 0.0
        for r, delay in delayed:
            times[r] += delay
            push = max(push, late[r] + delay - max_late)
        self.pushed += push
        if self.fw is not None:
            self.fw.delayed(call.phase, push)
        return push

    def _spell_slot(
        self, times: list[float], wseq: int, compute: float, call: _Call, base: float
    ) -> float:
        """Delay the ranks of the spells active at world instance ``wseq``; return how
        much later everything after starts (the collective waits for its last member)."""
        extra: dict[int, float] = {}
        for i, (f, ranks) in enumerate(self.spells):
            if wseq < f.from_instance or (f.to_instance is not None and wseq >= f.to_instance):
                continue
            by_phase = isinstance(f, SlowHost) and f.by_phase
            scale = _PHASE_COMPUTE.get(call.phase, 1.0) if by_phase else 1.0
            d = f.lateness_s + f.slowdown * compute * scale
            seen = self.spell_seen[i]
            if not seen:
                seen += [base, base, d]
            seen[1] = base
            seen[2] = max(seen[2], d)
            self.spell_delays[i][d] += 1
            for r in ranks:
                extra[r] = extra.get(r, 0.0) + d
        if not extra:
            return 0.0
        late = self.late
        max_late = max(late)
        push = 0.0
        for r, d in extra.items():
            times[r] += d
            push = max(push, late[r] + d - max_late)
        self.pushed += push
        if self.fw is not None:
            self.fw.delayed(call.phase, push)
        return push

    # ---- steps (the hot loop) --------------------------------------------------------

    def _coll_parts(
        self,
        call: _Call,
        rk: _Rank,
        *,
        op: str | None = None,
        count: int | None = None,
        dtype: int | None = None,
    ) -> tuple[str, str]:
        """Pre-format a COLL line around its opCount: (text before, text after incl. '\\n')."""
        c = self.world if call.world else self.host_comms[rk.host_index]
        size = len(c.members)
        cnt = call.count_of(size) if count is None else count
        dt = call.dtype if dtype is None else dtype
        name = call.op if op is None else op
        elem = 2 if dt in (_BF16, 6) else 4
        # Persistent per-(rank, buffer) addresses, as ZeRO-3's flat buffers are.
        base = rk.heap + (call.buffer * 2654435761 % 0xFFF) * 0x200000
        li = c.index(rk.rank)
        if name == "AllGather":  # in place: sendbuff = recvbuff + rank * sendcount
            send, recv = base + li * cnt * elem, base
        elif name == "ReduceScatter":  # in place: recvbuff = sendbuff + rank * recvcount
            send, recv = base, base + li * cnt * elem
        else:
            send = recv = base
        before = f"{rk.info}{name}: opCount "
        after = (
            f" sendbuff 0x{send:x} recvbuff 0x{recv:x} count {cnt} datatype {dt} op {_OP_SUM} "
            f"root 0 comm {c.ptr[rk.rank]} [nranks={size}] stream {rk.stream}\n"
        )
        return before, after

    def _mismatch_parts(self, call: _Call, mm: Mismatch) -> tuple[str, str]:
        rk = self.ranks[mm.rank]
        if mm.field == "op":
            return self._coll_parts(call, rk, op=_OTHER_OP[call.op])
        if mm.field == "count":
            return self._coll_parts(call, rk, count=call.count_of(self.n) * 2)
        return self._coll_parts(call, rk, dtype=_other_dtype(call.dtype))

    def _run_steps(self, base: float) -> None:
        """Emit the training steps until done, a terminal fault or the target size."""
        spec = self.spec
        prog = self.prog
        n = self.n
        rr = range(n)
        heads = [rk.head for rk in self.ranks]
        parts = [[self._coll_parts(call, rk) for rk in self.ranks] for call in prog]
        befores = [[p[0] for p in row] for row in parts]
        afters = [[p[1] for p in row] for row in parts]
        ts_on = spec.timestamps
        subsec_bug = self.era.subsec_bug
        offs = self.rank_off
        clocked = any(offs)
        late = self.late
        any_late = any(late)
        gap = spec.step_time_s / len(prog) + max(late)  # everyone waits for the straggler
        # Phased model (telemetry): the optimizer step is a pause after the step's last
        # collective; a contended host's ranks make everyone wait at the next first one.
        opt_gap = 0.0
        contended: list[int] = []
        extra_opt = 0.0
        if spec.telemetry:
            opt_gap = spec.step_time_s * self.opt_share
            gap = spec.step_time_s * (1.0 - self.opt_share) / len(prog) + max(late)
            names = set(spec.pcie_contention)
            switch = spec.contention_switch
            contended = [
                rk.rank
                for rk in self.ranks
                if rk.host in names
                and (switch is None or rk.local // spec.gpus_per_switch == switch)
            ]
            extra_opt = opt_gap * (spec.contention_inflation - 1.0)
        pending_extra = 0.0
        # Where the optimizer step ends: before the AllGather of the updated partitions
        # (ZeRO-1/2), else before the next step's first collective (slot 0).
        opt_at = next((i for i, c in enumerate(prog) if c.phase == "optim_ag"), 0)
        opt_before = (opt_at - 1) % len(prog)  # the slot the optimizer step follows
        self.slot_gap = gap
        slot_compute = gap - max(late)
        spells = self.spells
        rnd = self.rnd.random
        p_noise = self.p_noise
        noise = self.noise.line
        sec_cache = self.info_sec
        combined = self.combined
        rank_sink = self.rank_sink
        target = spec.target_size_bytes
        halt_at = self.halt_at
        mismatches: dict[int, list[Mismatch]] = {}
        for f in spec.faults:
            if isinstance(f, Mismatch) and (not f.hang or f.at_instance == halt_at):
                mismatches.setdefault(f.at_instance, []).append(f)
        no_skip: frozenset[int] = frozenset()
        world = self.world
        host0 = self.host_comms[0]
        max_steps = spec.steps if target is None else None
        written = self._flush_all()
        pending = 0
        last_sec = -1
        sec_str = ""
        times: list[float] = []
        n_prog = len(prog)
        n_warn = spec.benign_warns
        plan = self._warn_plan(written)
        # A WARN due at a slot goes between the previous slot's lines and this slot's.
        warn_offset = _JITTER_S + max(late)
        warn_room = max(gap - warn_offset, 0.0)
        fw = self.fw
        delays = self.delays
        world_slots = self.world_slots
        step = 0
        while max_steps is None or step < max_steps:
            for j, call in enumerate(prog):
                comm = world if call.world else host0
                seq = comm.seq
                if plan.next < n_warn:
                    full = target is not None and written + pending >= target
                    k = plan.due(
                        written + pending if plan.by_bytes else step * n_prog + j,
                        everything=full,
                    )
                    if k:
                        t_warn = base + warn_offset + self.warn_rnd.random() * warn_room
                        pending += self._benign_warns(k, t_warn)
                if target is not None and written + pending >= target:
                    self.end_reason = "target_size"
                    self._touch(max(times, default=self.t0))
                    return
                base += gap
                if opt_gap and opt_at and j == opt_at:  # ZeRO-1/2: the step is inside
                    base += opt_gap
                    pending_extra = self._contend(step, contended, extra_opt)
                oc = "0" if comm.zero_opcount else f"{seq:x}"
                bj = befores[j]
                aj = afters[j]
                halting = call.world and seq == halt_at
                mms = mismatches.get(seq) if call.world else None
                if mms:
                    bj = list(bj)
                    aj = list(aj)
                    for mm in mms:
                        bj[mm.rank], aj[mm.rank] = self._mismatch_parts(call, mm)
                skip = self.stops_at_halt if halting else no_skip
                prev_times = times  # the slot before (any comm: every rank is in one)
                if any_late:
                    times = [base + rnd() * _JITTER_S + late[r] for r in rr]
                else:
                    times = [base + rnd() * _JITTER_S for _ in rr]
                if call.world and world_slots is not None:
                    world_slots.append((step * n_prog + j, self.pushed))
                if spells:
                    # The compute before this slot: the optimizer step counts for the
                    # slot after it.
                    compute = slot_compute + (opt_gap if j == opt_at else 0.0)
                    base += self._spell_slot(times, world.seq, compute, call, base)
                if delays and call.world and seq in delays:
                    base += self._delay_slot(times, delays[seq], call)
                if j == opt_at and pending_extra:
                    for r in contended:
                        times[r] += pending_extra
                    base += pending_extra
                    self.pushed += pending_extra
                    if fw is not None and 0 not in contended:  # rank 0 waits for them
                        fw.delayed(call.phase, pending_extra)
                    pending_extra = 0.0
                if spec.telemetry:
                    if j == 0:
                        self.step_first.append(list(times))
                    if j == opt_at and len(self.opt_end) < len(self.opt_start):
                        self.opt_end.append(list(times))
                    if j == opt_before:
                        self.opt_start.append(list(times))
                if halting and (self.extra_at_halt or self.dead_at_halt):
                    self._halt_slot(call, seq, oc, bj, aj, times, prev_times, skip, step)
                    self._count_slot(call, skip, mms)
                    self._halt(times)
                    return
                out: list[str] = []
                for r in sorted(rr, key=times.__getitem__) if combined else rr:
                    if skip and r in skip:
                        continue
                    t = times[r]
                    if ts_on:
                        pt = t + offs[r] if clocked else t  # printed by the host's clock
                        sec = int(pt)
                        if sec != last_sec:
                            last_sec = sec
                            sec_str = sec_cache.get(sec)
                        if subsec_bug:
                            line = (
                                f"{heads[r]}{sec_str}.{_subsec_226(pt - sec)}] {bj[r]}{oc}{aj[r]}"
                            )
                        else:
                            line = (
                                f"{heads[r]}{sec_str}.{int((pt - sec) * 1e6):06d}] "
                                f"{bj[r]}{oc}{aj[r]}"
                            )
                    else:
                        line = f"{heads[r]}{bj[r]}{oc}{aj[r]}"
                    if combined:
                        out.append(line)
                        if p_noise and rnd() < p_noise:
                            out.append(noise(r, t, step))
                    else:
                        rank_sink[r].pending.append(line)
                        pending += len(line)
                if combined:
                    text = "".join(out)
                    rank_sink[0].pending.append(text)
                    pending += len(text)
                self._count_slot(call, skip, mms)
                if halting:
                    self._halt(times)
                    return
                if pending >= _FLUSH_CHARS:
                    written = self._flush_all()
                    pending = 0
            if opt_gap and not opt_at:  # ZeRO-3: the optimizer step ends the step
                base += opt_gap
                pending_extra = self._contend(step, contended, extra_opt)
            if fw is not None:  # rank 0 logs its timers once the step's last slot is done
                t_print = base + warn_offset + 0.5 * warn_room
                if 0 in contended and pending_extra and not opt_at:
                    t_print += pending_extra
                pending += fw.step_done(step + 1, t_print)
            step += 1
            self.steps_completed = step
        if times:
            self._touch(max(times))
        if len(self.opt_end) < len(self.opt_start):  # the last step's optimizer step
            self.opt_end.append(
                [base + gap + (pending_extra if r in contended else 0.0) for r in rr]
            )

    def _contend(self, step: int, contended: list[int], extra: float) -> float:
        """The contended ranks' extra optimizer time in this step (0: not contended)."""
        if not contended or step < self.spec.contention_from_step:
            return 0.0
        self.contended_steps.append(step)
        fw = self.fw
        if fw is not None and 0 in contended:  # rank 0's own optimizer step grew
            fw.step_extra["step"] = fw.step_extra.get("step", 0.0) + extra
            fw.step_extra["optimizer_step"] = extra
            fw.step_push += extra
        return extra

    def _count_slot(self, call: _Call, skip: frozenset[int], mms: list[Mismatch] | None) -> None:
        by = self.calls_by_op
        if not call.world:
            for c in self.host_comms:
                c.calls += len(c.members)
                c.seq += 1
            by[call.op] = by.get(call.op, 0) + self.n
            return
        entered = self.n - len(skip)
        self.world.calls += entered
        if skip:
            self.skipped = skip
        self.world.seq += 1
        by[call.op] = by.get(call.op, 0) + entered
        if self.extra_logged:  # the extra AllReduces, and the culprits' real calls one later
            extra = len(self.extra_at_halt)
            self.world.calls += extra
            self.world.seq += 1
            by["AllReduce"] = by.get("AllReduce", 0) + extra
        for mm in mms or ():
            if mm.field == "op" and mm.rank not in skip:
                other = _OTHER_OP[call.op]
                by[call.op] -= 1
                by[other] = by.get(other, 0) + 1

    def _halt_slot(
        self,
        call: _Call,
        seq: int,
        oc: str,
        befores: list[str],
        afters: list[str],
        times: list[float],
        prev_times: list[float],
        skip: frozenset[int],
        step: int,
    ) -> None:
        """Write the halting slot when an ExtraCollective or a DeadProcess is in it.

        The extra-calling ranks log two lines: the extra AllReduce at this opCount, then
        their real call one later. Dead ranks log nothing, and nothing is printed for them
        (noise that would carry a dead rank's prefix is dropped). Same layout rules and
        noise draws as the hot loop.
        """
        extra_call = _Call(True, "AllReduce", lambda size: 1, _FP32, 5000, "norm")
        oc_next = "0" if self.world.zero_opcount else f"{seq + 1:x}"
        rows = [(times[r], r, 0) for r in range(self.n) if r not in skip]
        for r in sorted(self.extra_at_halt):
            # The real call is enqueued right after the extra one (host-side enqueue only).
            rows.append((times[r] + self.fault_rnd.uniform(0.00005, 0.0003), r, 1))
            self.extra_logged = True
        if self.combined:
            rows.sort()
        else:
            rows.sort(key=lambda row: (row[1], row[0]))
        self.noise.silent = frozenset(self.dead_at_halt)
        for r in sorted(self.dead_at_halt):
            # Dead "just before" it would have enqueued, in the later half of the time since
            # its previous enqueue (before the first slot: of one slot's time).
            since = times[r] - prev_times[r] if prev_times else self.slot_gap
            self.death_times[r] = times[r] - self.fault_rnd.random() * 0.5 * since
        out: list[str] = []
        for t, r, second in rows:
            rk = self.ranks[r]
            before, opc, after = befores[r], oc, afters[r]
            if second:
                opc = oc_next
            elif r in self.extra_at_halt:
                before, after = self._coll_parts(extra_call, rk)
            line = f"{rk.head}{self._ts(t + self.rank_off[r])}{before}{opc}{after}"
            if self.combined:
                out.append(line)
                if self.p_noise and self.rnd.random() < self.p_noise:
                    out.append(self.noise.line(r, t, step))
            else:
                self.rank_sink[r].add(line)
            self._touch(t)
        if self.combined:
            self.rank_sink[0].add("".join(out))

    # ---- fault aftermath -------------------------------------------------------------

    def _halt(self, times: list[float]) -> None:
        """The job stops in this slot: what follows a terminal fault."""
        self._touch(max(times))
        self.halt_times = times
        self._aftermath(max(times))

    def _aftermath(self, t_last: float) -> None:
        if self.ib_at_halt is not None:
            self.end_reason = "error"
            self._ib_error(self.ib_at_halt, t_last)
            return
        # A death is what ends the job (torchrun sees it); NCCL-side it is still a hang.
        self.end_reason = "died" if self.dead_at_halt else "hang"
        if self.fw is not None:
            self.fw.hang()

    def _ib_error(self, fault: IbError, t_last: float) -> None:
        era = self.era
        h = next(i for i in range(self.spec.hosts) if self.spec.host_name(i) == fault.host)
        culprit = self.ranks[h * self.rph + self.rph - 1]  # the host's cross-node ring sender
        peer = self.ranks[(culprit.rank + 1) % self.n]  # its receiver on the next host
        # ~ one IB retry timeout later (4.096 us * 2^22 at NCCL_IB_TIMEOUT=22).
        t = t_last + 17.18 + self.rnd.uniform(0.0, 0.3)
        src = f"{era.ib_file}:{era.ib_line}"
        records: list[tuple[float, int, str, bool]] = []
        messages: list[str] = []
        for rk, other, tt, status, opcode, vendor, req in (
            (culprit, peer, t, 12, 0, 129, "Send"),  # RETRY_EXC_ERR on the sender
            (peer, culprit, t + 0.0021, 5, 129, 244, "Recv"),  # WR_FLUSH_ERR on the receiver
        ):
            msg = era.ib_error.format(
                peer=f"{other.ip}<{40000 + other.rank}>",
                status=status,
                opcode=opcode,
                vendor=vendor,
                req=req,
                gids=f" localGid ::ffff:{rk.ip} remoteGids::ffff:{other.ip}",
                hca=f"mlx5_{rk.local * _N_NICS // self.rph}",
            )
            messages.append(msg)
            records.append((tt, rk.rank, self._warn(rk, tt, src, msg), True))
            for k, loc in enumerate(era.chain):
                suffix = era.chain_last_suffix if k == len(era.chain) - 1 else ""
                tk = tt + 0.00001 * (k + 1)
                chain = f"{loc} -> {era.ib_code}{suffix}"
                records.append((tk, rk.rank, self._info(rk, tk, chain, proxy=True), False))
            if era.end_line is not None:  # PyTorch's watchdog aborts the failed comms
                for ci, c in enumerate((self.host_comms[rk.host_index], self.world)):
                    tk = tt + 0.8 + 0.01 * ci
                    line = era.end_line.format(
                        comm=c.ptr[rk.rank],
                        rank=c.index(rk.rank),
                        nranks=len(c.members),
                        dev=rk.local,
                        bus=rk.bus,
                        what="Abort",
                    )
                    records.append((tk, rk.rank, self._info(rk, tk, line), False))
        records.sort(key=lambda rec: (rec[0], rec[1]))
        self._flush_all()
        pos: dict[int, tuple[str, int]] = {}
        for tt, r, text, is_warn in records:
            sink = self.rank_sink[r]
            if is_warn:  # +1 for the empty line, +1 for the WARN itself
                pos[r] = (sink.rel, sink.lines + sink.pending_lines() + 2)
            sink.add(text)
            self._touch(tt)
        self.ib_info = _IbInfo(
            culprit=culprit,
            peer=peer,
            culprit_pos=pos[culprit.rank],
            peer_pos=pos[peer.rank],
            message=messages[0],
            peer_message=messages[1],
        )
