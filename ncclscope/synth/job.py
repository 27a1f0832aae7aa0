"""The driver: run a job, then build its truth from what was decided; ``generate``."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ncclscope.synth.faults import (
    _OTHER_OP,
    DeadProcess,
    ExtraCollective,
    Fault,
    Mismatch,
    SlowHost,
    SlowRank,
    SlowSpell,
    StopRank,
    _fault_json,
    _other_dtype,
)
from ncclscope.synth.framework_hang import _Framework
from ncclscope.synth.options import _FP32, TRUTH_FILE, Json
from ncclscope.synth.parts import _iso
from ncclscope.synth.spec import SynthSpec, _spec_json
from ncclscope.synth.steps import _JobSteps
from ncclscope.synth.truth import CommRecord, FaultOutcome, FileRecord, RankRecord, Truth

if TYPE_CHECKING:
    from ncclscope.synth.telemetry import TelemetryJob


class _Job(_JobSteps):
    """All state of one generation run."""

    # ---- driver and truth ------------------------------------------------------------

    def _framework(self) -> _Framework:
        return _Framework(self)

    def run(self) -> Truth:
        init = self._init_events()
        steps_t0 = max(evs[-1][0] for evs in init) + 1.5
        if self.fw is not None:  # engine set-up fills the gap before the first step
            self.fw.init_events(init, steps_t0)
        self._open_sinks()
        try:
            self._emit_events(init)
            self._run_steps(steps_t0)
            if self.end_reason in ("completed", "target_size"):
                ends = self._end_events()
                if self.fw is not None:
                    self.fw.end_events(ends)
                self._emit_events(ends)
        finally:
            for s in self.sinks:
                s.close()
        truth = self._truth()
        if self.spec.telemetry:
            from ncclscope.synth.telemetry import write_telemetry

            truth = replace(truth, telemetry=write_telemetry(self._telemetry_job(), self.out_dir))
        (self.out_dir / TRUTH_FILE).write_text(truth.to_json() + "\n", encoding="utf-8")
        return truth

    def _telemetry_job(self) -> TelemetryJob:
        from ncclscope.synth.telemetry import TelemetryJob

        spec = self.spec
        fw = self.fw
        return TelemetryJob(
            hosts=[spec.host_name(h) for h in range(spec.hosts)],
            host_offsets=list(self.host_off),
            rank_host=[rk.host_index for rk in self.ranks],
            rank_local=[rk.local for rk in self.ranks],
            rank_bus=[rk.bus for rk in self.ranks],
            step_first=self.step_first,
            opt_start=self.opt_start,
            opt_end=self.opt_end,
            t_start=self.t0,
            t_end=self.last_t,
            interval_s=spec.telemetry_interval_s,
            offload_optimizer=fw is not None and fw.off_opt,
            offload_param=fw is not None and fw.off_param,
            contention_hosts=list(spec.pcie_contention),
            contended_steps=list(self.contended_steps),
            inflation=spec.contention_inflation,
            growth_ranks=list(spec.memory_growth),
            growth_bytes_per_step=spec.memory_growth_bytes_per_step,
            cache_ratio=spec.gpu_cache_ratio,
            seed=spec.seed,
            gpus_per_switch=spec.gpus_per_switch,
            contention_switch=spec.contention_switch,
            memory_pressure=spec.contention_memory_pressure,
            idle_swap_bytes=spec.idle_swap_bytes,
            domain=spec.telemetry_domain,
        )

    def _last_seq(self) -> dict[str, dict[str, int | None]]:
        out: dict[str, dict[str, int | None]] = {}
        for c in self.comms:
            last = c.seq - 1 if c.seq > 0 else None
            out[c.name] = {str(g): last for g in c.members}
        for r in self.skipped:
            out["world"][str(r)] = self.halt_at - 1 if self.halt_at > 0 else None
        if self.extra_logged:  # the culprits are one ahead: everyone else stopped at halt_at
            for r in range(self.n):
                if r not in self.skipped and r not in self.extra_at_halt:
                    out["world"][str(r)] = self.halt_at
        return out

    def _truth(self) -> Truth:
        last = self._last_seq()
        comms = [
            CommRecord(
                name=c.name,
                comm_id=f"0x{c.comm_id:x}" if c.comm_id is not None else None,
                nranks=len(c.members),
                ranks=list(c.members),
                n_nodes=c.n_nodes,
                n_channels=c.nch,
                init_func=c.func or None,
                comm_ptrs={str(g): c.ptr[g] for g in c.members},
                calls=c.calls,
                instances=c.seq,
                last_seq=last[c.name],
                opcount_printed="zero" if c.zero_opcount else "seq",
            )
            for c in self.comms
        ]
        ranks = [
            RankRecord(
                rank=rk.rank,
                host=rk.host,
                host_index=rk.host_index,
                local_rank=rk.local,
                pid=rk.pid,
                tid=rk.pid,
                proxy_tid=rk.proxy_tid,
                cuda_dev=rk.local,
                nvml_dev=rk.local,
                bus_id=rk.bus,
                file=rk.file,
                launcher_prefix=rk.head,
            )
            for rk in self.ranks
        ]
        return Truth(
            spec=_spec_json(self.spec),
            nccl_version=self.era.nccl_version,
            files=[FileRecord(path=s.rel, lines=s.lines, bytes=s.bytes) for s in self.sinks],
            ranks=ranks,
            communicators=comms,
            coll_calls=sum(c.calls for c in self.comms),
            coll_instances=sum(c.seq for c in self.comms),
            calls_by_op=dict(sorted(self.calls_by_op.items())),
            world_instances=self.world.seq,
            steps_completed=self.steps_completed,
            end_reason=self.end_reason,
            non_nccl_lines=self.noise.count + (self.fw.lines if self.fw is not None else 0),
            first_ts=_iso(self.first_t if math.isfinite(self.first_t) else self.t0),
            last_ts=_iso(self.last_t),
            faults=[self._outcome(f, last) for f in self.spec.faults],
            benign_warns=list(self.benign),
            framework=self.fw.truth() if self.fw is not None else None,
            clock_offsets=self._clock_truth(),
            noise=(
                list(self.noise_events)
                if self.spec.jitter_events or self.spec.truth_format >= 2
                else None
            ),
            format_version=self.spec.truth_format,
        )

    def _clock_truth(self) -> list[dict[str, Json]] | None:
        spec = self.spec
        if spec.clock_offset_max_s <= 0 and not spec.clock_offsets_s and spec.truth_format < 2:
            return None
        return [
            {"host_index": h, "host": self.spec.host_name(h), "offset_s": off}
            for h, off in enumerate(self.host_off)
        ]

    def _median_world_gap(self) -> float:
        """Median time between consecutive world collectives, as the time model made them."""
        slot = self.spec.step_time_s / len(self.prog) + max(self.late)
        marks = self.world_slots or []
        if len(marks) < 2:  # no two world collectives: one slot of the time model
            return slot
        return statistics.median(
            (k2 - k1) * slot + (p2 - p1) for (k1, p1), (k2, p2) in itertools.pairwise(marks)
        )

    def _spell_outcome(self, f: SlowHost | SlowSpell) -> FaultOutcome:
        i = next(k for k, (g, _) in enumerate(self.spells) if g is f)
        ranks = self.spells[i][1]
        seen = self.spell_seen[i]
        counts = self.spell_delays[i]
        typical = 0.0
        if counts:  # the median slot's delay
            half, run = sum(counts.values()) / 2, 0
            for d in sorted(counts):
                run += counts[d]
                if run >= half:
                    typical = d
                    break
        # The gap between world collectives the delay makes (it holds everyone up).
        gap = self._median_world_gap() if self.world_slots is not None else self.slot_gap + typical
        details: dict[str, Json] = {
            "ranks": list(ranks),
            "host": self.ranks[ranks[0]].host,
            "from_instance": f.from_instance,
            "to_instance": f.to_instance,
            # true times (not shifted by any clock offset) of the first and last slot
            # the spell delayed, and its largest delay of one slot
            "start": _iso(seen[0]) if seen else None,
            "end": _iso(seen[1]) if seen else None,
            "max_delay_s": seen[2] if seen else 0.0,
            "median_delay_s": typical,
            # the median slot's delay over the median gap between world collectives
            "slowdown": typical / gap if gap > 0 else 0.0,
            "visible_in_timestamps": self.spec.timestamps,
        }
        return FaultOutcome(type(f).__name__, _fault_json(f), bool(seen) and seen[2] > 0, details)

    def _outcome(self, f: Fault, last: dict[str, dict[str, int | None]]) -> FaultOutcome:
        kind = type(f).__name__
        details: dict[str, Json] = {}
        if isinstance(f, SlowHost | SlowSpell):
            return self._spell_outcome(f)
        if isinstance(f, SlowRank):
            rk = self.ranks[f.rank]
            details = {
                "rank": f.rank,
                "host": rk.host,
                "pid": rk.pid,
                "lateness_s": f.lateness_s,
                "visible_in_timestamps": self.spec.timestamps,
            }
            if self.world_slots is not None:
                gap = self._median_world_gap()
                details["slowdown"] = f.lateness_s / gap
                details["median_world_gap_s"] = gap
            return FaultOutcome(kind, _fault_json(f), f.lateness_s > 0, details)
        # Instances every rank got to (the culprits of an ExtraCollective went one further).
        reached = f.at_instance < self.world.seq - (1 if self.extra_logged else 0)
        if isinstance(f, Mismatch) and not f.hang:
            effective = reached and not (f.at_instance == self.halt_at and f.rank in self.skipped)
        elif isinstance(f, Mismatch):
            effective = reached and f.at_instance == self.halt_at and f.rank not in self.skipped
        else:
            effective = reached and f.at_instance == self.halt_at
        details = {"at_instance": f.at_instance, "reached": reached}
        last_json: dict[str, Json] = {name: dict(per) for name, per in last.items()}
        if isinstance(f, StopRank):
            rk = self.ranks[f.rank]
            details.update({"rank": f.rank, "host": rk.host, "pid": rk.pid})
            details["last_seq"] = last_json
        elif isinstance(f, ExtraCollective):
            rk = self.ranks[f.rank]
            call = self._world_call(f.at_instance)
            others: dict[str, Json] = {
                "op": call.op,
                "count": call.count_of(self.n),
                "datatype": call.dtype,
            }
            extra: dict[str, Json] = {"op": "AllReduce", "count": 1, "datatype": _FP32}
            details.update(
                {
                    "rank": f.rank,
                    "host": rk.host,
                    "pid": rk.pid,
                    "seq": f.at_instance,
                    "opcount": "0" if self.world.zero_opcount else f"{f.at_instance:x}",
                    "op": "AllReduce",
                    "extra": extra,
                    "expected": others,
                    "differs": [k for k in ("op", "count", "datatype") if extra[k] != others[k]],
                    "real_call_seq": f.at_instance + 1,
                    "last_seq": last_json,
                }
            )
        elif isinstance(f, DeadProcess):
            rk = self.ranks[f.rank]
            died = self.death_times.get(f.rank)
            details.update(
                {
                    "rank": f.rank,
                    "host": rk.host,
                    "pid": rk.pid,
                    "signal": f.signal,
                    "exit_code": f.exit_code,
                    "died_at": _iso(died) if died is not None and effective else None,
                    "last_seq": last_json,
                }
            )
        elif isinstance(f, Mismatch):
            rk = self.ranks[f.rank]
            call = self._world_call(f.at_instance)
            cnt = call.count_of(self.n)
            expected: dict[str, Json] = {"op": call.op, "count": cnt, "datatype": call.dtype}
            logged = dict(expected)
            if f.field == "op":
                logged["op"] = _OTHER_OP[call.op]
            elif f.field == "count":
                logged["count"] = cnt * 2
            else:
                logged["datatype"] = _other_dtype(call.dtype)
            details.update(
                {
                    "rank": f.rank,
                    "host": rk.host,
                    "pid": rk.pid,
                    "expected": expected,
                    "logged": logged,
                    "hang": f.hang,
                }
            )
        elif effective and self.ib_info is not None:
            info = self.ib_info
            details.update(
                {
                    "host": info.culprit.host,
                    "rank": info.culprit.rank,
                    "pid": info.culprit.pid,
                    "tid": info.culprit.proxy_tid,
                    "file": info.culprit_pos[0],
                    "line_no": info.culprit_pos[1],
                    "warn_src": f"{self.era.ib_file}:{self.era.ib_line}",
                    "message": info.message,
                    "return_code": self.era.ib_code,
                    "consequential": [
                        {
                            "host": info.peer.host,
                            "rank": info.peer.rank,
                            "pid": info.peer.pid,
                            "tid": info.peer.proxy_tid,
                            "file": info.peer_pos[0],
                            "line_no": info.peer_pos[1],
                            "message": info.peer_message,
                        }
                    ],
                }
            )
        return FaultOutcome(kind, _fault_json(f), effective, details)


def generate(spec: SynthSpec, out_dir: Path) -> Truth:
    """Write a synthetic job's logs and ``truth.json`` into ``out_dir``.

    Args:
        spec: What to generate (validated when it was constructed).
        out_dir: Directory to write into (created if missing). Files with the same names
            are overwritten; other files are left alone.

    Returns:
        The ground truth, also written to ``out_dir / "truth.json"``.

    Raises:
        OSError: The files could not be written.
    """
    return _Job(spec, out_dir).run()
