"""A job's state and its NCCL lines: ranks, communicators, collective program, init and end."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ncclscope.synth.eras import _ERA_FORMATS
from ncclscope.synth.faults import (
    DeadProcess,
    ExtraCollective,
    IbError,
    SlowHost,
    SlowRank,
    SlowSpell,
    StopRank,
)
from ncclscope.synth.options import _BF16, _FP32, COMBINED_FILE, Json
from ncclscope.synth.parts import (
    _N_NICS,
    _bus_id,
    _Call,
    _Comm,
    _FrameworkLines,
    _IbInfo,
    _Noise,
    _Rank,
    _SecondCache,
    _Sink,
    _subsec_226,
)
from ncclscope.synth.spec import SynthSpec, _parse_start
from ncclscope.synth.truth import BenignWarnRecord


class _JobLines:
    """All state of one generation run, and its NCCL lines outside the steps.

    ``steps._JobSteps`` adds the step loop and ``job._Job`` the driver and the truth.
    """

    def __init__(self, spec: SynthSpec, out_dir: Path) -> None:
        self.spec = spec
        self.out_dir = out_dir
        self.era = _ERA_FORMATS[spec.era]
        self.rnd = random.Random(spec.seed)
        self.n = spec.ranks
        self.rph = spec.ranks_per_host
        self.multi = spec.hosts > 1
        self.combined = spec.layout == "combined"
        self.t0 = _parse_start(spec.start_time)
        self.info_sec = _SecondCache("[%Y-%m-%d %H:%M:%S")
        self.first_t = math.inf
        self.last_t = self.t0
        self.ranks = self._make_ranks()
        # Host clock offsets draw from their own generator (every other draw stays as it
        # was); printed time = true time + offset of the printing process's host.
        clock_rnd = random.Random(spec.seed * 7919 + 4)
        m = spec.clock_offset_max_s
        self.host_off = [clock_rnd.uniform(-m, m) if m > 0 else 0.0 for _ in range(spec.hosts)]
        if spec.clock_offsets_s:
            self.host_off = list(spec.clock_offsets_s)
        self.rank_off = [self.host_off[rk.host_index] for rk in self.ranks]
        self.world, self.host_comms = self._make_comms()
        self.comms = [self.world, *self.host_comms]
        self.prog = self._program()
        self.late = [0.0] * self.n
        for f in spec.faults:
            if isinstance(f, SlowRank):
                self.late[f.rank] = f.lateness_s
        # Slow spells (SlowHost, SlowSpell): the ranks each slows down, and per spell the
        # true times of the first and last slot it delayed and the largest delay.
        self.spells: list[tuple[SlowHost | SlowSpell, list[int]]] = [
            (
                f,
                [rk.rank for rk in self.ranks if rk.host == f.host]
                if isinstance(f, SlowHost)
                else [f.rank],
            )
            for f in spec.faults
            if isinstance(f, SlowHost | SlowSpell)
        ]
        self.spell_seen: list[list[float]] = [[] for _ in self.spells]
        # Per spell: how many slots it delayed by each amount (few distinct amounts).
        self.spell_delays: list[Counter[float]] = [Counter() for _ in self.spells]
        # World instance at which the job ends (-1: it does not end early).
        self.halt_at = spec.halt_instance
        # Ranks that never enter halt_at: stopped (stuck elsewhere) or dead.
        self.stops_at_halt = frozenset(
            f.rank
            for f in spec.faults
            if isinstance(f, StopRank | DeadProcess) and f.at_instance == self.halt_at
        )
        self.dead_at_halt = {
            f.rank: f
            for f in spec.faults
            if isinstance(f, DeadProcess) and f.at_instance == self.halt_at
        }
        self.extra_at_halt = frozenset(
            f.rank
            for f in spec.faults
            if isinstance(f, ExtraCollective) and f.at_instance == self.halt_at
        )
        self.death_times: dict[int, float] = {}  # dead rank -> when its process died
        self.extra_logged = False  # the extra calls at halt_at were written
        self.ib_at_halt = next(
            (f for f in spec.faults if isinstance(f, IbError) and f.at_instance == self.halt_at),
            None,
        )
        self.calls_by_op: dict[str, int] = {}
        self.steps_completed = 0
        self.end_reason = "completed"
        self.skipped: frozenset[int] = frozenset()  # ranks that never entered halt_at
        self.ib_info: _IbInfo | None = None
        self.sinks: list[_Sink] = []
        self.rank_sink: list[_Sink] = []
        noise_on = self.combined and spec.non_nccl_frac > 0
        # p per NCCL line so that non-NCCL lines are ~non_nccl_frac of all lines.
        self.p_noise = spec.non_nccl_frac / (1.0 - spec.non_nccl_frac) if noise_on else 0.0
        total_steps = spec.steps if spec.target_size_bytes is None else 100000
        self.noise = _Noise(
            random.Random(spec.seed * 7919 + 1),
            [rk.head for rk in self.ranks],
            total_steps,
            spec.framework,
        )
        self.noise_on = noise_on
        self.noise.offset0 = self.rank_off[0]
        # Benign WARNs draw from their own generator, so that benign_warns=0 leaves every
        # other random choice (and so every byte) as it was.
        self.warn_rnd = random.Random(spec.seed * 7919 + 2)
        self.benign: list[BenignWarnRecord] = []
        # One-off delays (jitter_events) draw from their own generator as well.
        self.delays: dict[int, list[tuple[int, float]]] = {}  # world seq -> [(rank, s)]
        self.noise_events: list[dict[str, Json]] = []
        self._draw_delays()
        # Where each world collective started, for the median gap (truth_format 2 only: a
        # multi-GB job has millions): (slot index, delays' push so far). Kept as slots, not
        # absolute times, whose differences would lose digits.
        self.world_slots: list[tuple[int, float]] | None = [] if spec.truth_format >= 2 else None
        self.pushed = 0.0
        # The new faults' own random choices (death instants, extra-call gaps).
        self.fault_rnd = random.Random(spec.seed * 7919 + 6)
        self.slot_gap = 0.0  # the time model's gap between slots (set by _run_steps)
        self.t_world_init = self.t0  # when the world communicator's init starts
        self.halt_times: list[float] = []  # per rank: when it entered halt_at (if it did)
        # Framework lines draw from their own generator too (see _Framework).
        self.fw = self._framework() if spec.framework != "none" else None
        # Phased time model (telemetry): the optimizer step's share of a step, and per step
        # every rank's (true) enqueue time of the step's first and last collective.
        self.opt_share = self.fw.share["step"] if self.fw is not None and self.fw.ds else 0.08
        self.step_first: list[list[float]] = []
        self.opt_start: list[list[float]] = []
        self.opt_end: list[list[float]] = []
        self.contended_steps: list[int] = []

    # ---- identities ------------------------------------------------------------------

    def _launcher_prefix(self, rank: int, local: int, host: str) -> str:
        kind = self.spec.launcher
        if kind == "torchrun":
            return f"[default{local}]:"
        if kind == "rank":
            return f"[rank{rank}]:"
        if kind == "srun":
            # srun --label right-aligns task ids to the width of the largest one.
            return f"{rank:>{len(str(self.n - 1))}d}: "
        if kind == "pdsh":
            return f"{host}: "
        return ""

    def _ptr(self) -> str:
        return f"0x{0x550000000000 + self.rnd.getrandbits(36) * 16:x}"

    def _make_ranks(self) -> list[_Rank]:
        rnd = self.rnd
        pids: set[int] = set()
        out: list[_Rank] = []
        for r in range(self.n):
            h, local = divmod(r, self.rph)
            host = self.spec.host_name(h)
            pid = rnd.randrange(10000, 999999)
            while pid in pids:
                pid = rnd.randrange(10000, 999999)
            pids.add(pid)
            proxy_tid = pid + rnd.randrange(40, 400)
            out.append(
                _Rank(
                    rank=r,
                    host=host,
                    host_index=h,
                    local=local,
                    pid=pid,
                    proxy_tid=proxy_tid,
                    bus=_bus_id(local),
                    ip=f"10.{10 + h // 250}.{h % 250}.11",
                    head=self._launcher_prefix(r, local, host) if self.combined else "",
                    info=f"{host}:{pid}:{pid} [{local}] NCCL INFO ",
                    proxy_info=f"{host}:{pid}:{proxy_tid} [{local}] NCCL INFO ",
                    stream=self._ptr(),
                    heap=0x7F0000000000 + rnd.randrange(1, 0xFF) * 0x100000000,
                    file=COMBINED_FILE if self.combined else f"{host}.{pid}.log",
                )
            )
        return out

    def _make_comms(self) -> tuple[_Comm, list[_Comm]]:
        era = self.era

        def make(name: str, members: list[int], host: int | None) -> _Comm:
            nodes = 1 if host is not None else self.spec.hosts
            return _Comm(
                name=name,
                members=members,
                host_index=host,
                comm_id=self.rnd.getrandbits(64) if era.has_commid else None,
                ptr={g: self._ptr() for g in members},
                n_nodes=nodes,
                nch=16 if nodes > 1 else 24,
                func=era.world_func if host is None else era.host_func,
                zero_opcount=era.opcount_zero_single_node and nodes == 1,
            )

        world = make("world", list(range(self.n)), None)
        hosts = [
            make(f"host{h}", list(range(h * self.rph, (h + 1) * self.rph)), h)
            for h in range(self.spec.hosts)
        ]
        return world, hosts

    def _program(self) -> list[_Call]:
        """One step's calls in program order (identical on every rank)."""
        spec = self.spec
        hidden = self.rnd.choice((2048, 4096, 5120, 8192))
        params = [
            50304 * hidden if layer == 0 else 12 * hidden * hidden + 13 * hidden
            for layer in range(spec.layers)
        ]

        def shard(p: int) -> Callable[[int], int]:
            return lambda size: -(-p // size)  # ceil: ZeRO-3 pads partitions

        def activations(size: int) -> int:
            return 4096 * hidden // size

        self.hidden = hidden
        self.params = params
        # ZeRO-1/2 keep whole parameters: no parameter all-gathers in forward/backward, the
        # updated partitions are all-gathered after the optimizer step instead.
        gather_params = not spec.zero12
        prog: list[_Call] = []
        for layer in range(spec.layers):
            if gather_params:
                prog.append(_Call(True, "AllGather", shard(params[layer]), _BF16, layer, "fwd"))
            if spec.tp_traffic:
                prog.append(_Call(False, "AllReduce", activations, _BF16, 1000 + layer, "fwd"))
        for layer in reversed(range(spec.layers)):
            if gather_params:
                prog.append(_Call(True, "AllGather", shard(params[layer]), _BF16, layer, "bwd"))
            if spec.tp_traffic:
                prog.append(_Call(False, "AllReduce", activations, _BF16, 2000 + layer, "bwd"))
            prog.append(
                _Call(True, "ReduceScatter", shard(params[layer]), _BF16, 3000 + layer, "reduce")
            )
        prog.append(_Call(True, "AllReduce", lambda size: 1, _FP32, 4000, "norm"))
        if not gather_params:
            prog += [
                _Call(True, "AllGather", shard(params[layer]), _BF16, layer, "optim_ag")
                for layer in range(spec.layers)
            ]
        return prog

    # ---- line helpers ----------------------------------------------------------------

    def _ts(self, t: float) -> str:
        if not self.spec.timestamps:
            return ""
        sec = int(t)
        if self.era.subsec_bug:
            return f"{self.info_sec.get(sec)}.{_subsec_226(t - sec)}] "
        return f"{self.info_sec.get(sec)}.{int((t - sec) * 1e6):06d}] "

    def _warn_ts(self, t: float) -> str:
        if self.spec.timestamps:
            return self._ts(t)
        if self.era.warn_default_ts:  # 2.26+ default NCCL_DEBUG_TIMESTAMP_LEVELS=WARN
            return f"{self.info_sec.get(int(t))}] "
        return ""

    def _info(self, rk: _Rank, t: float, msg: str, *, proxy: bool = False) -> str:
        ts = self._ts(t + self.rank_off[rk.rank])
        return f"{rk.head}{ts}{rk.proxy_info if proxy else rk.info}{msg}\n"

    def _warn(
        self,
        rk: _Rank,
        t: float,
        src: str,
        msg: str,
        *,
        tid: int | None = None,
        dev: int | None = None,
    ) -> str:
        # NCCL writes "\n" + line in one write: an empty line always precedes a WARN, and
        # the launcher prefixes both. Default thread: the proxy thread, on the rank's GPU.
        return (
            f"{rk.head}\n{rk.head}{self._warn_ts(t + self.rank_off[rk.rank])}{rk.host}:{rk.pid}:"
            f"{rk.proxy_tid if tid is None else tid} "
            f"[{rk.local if dev is None else dev}] {src} NCCL WARN {msg}\n"
        )

    def _framework(self) -> _FrameworkLines:
        """The framework's line writer: ``_Job`` makes it (``framework_hang._Framework``)."""
        raise NotImplementedError

    def _touch(self, t: float) -> None:
        self.first_t = min(self.first_t, t)
        self.last_t = max(self.last_t, t)

    # ---- init phase ------------------------------------------------------------------

    def _banner(self) -> str:
        return f"NCCL version {self.era.nccl_version}+cuda{self.era.cuda_version}"

    def _init_line(self, fmt: str, c: _Comm, rk: _Rank, what: str) -> str:
        return fmt.format(
            func=c.func,
            comm=c.ptr[rk.rank],
            rank=c.index(rk.rank),
            nranks=len(c.members),
            dev=rk.local,
            nvml=rk.local,
            bus=rk.bus,
            cid=f"0x{c.comm_id:x}" if c.comm_id is not None else "",
            what=what,
        )

    def _ring_list(self, c: _Comm) -> list[str]:
        n = len(c.members)
        out = []
        for ch in range(c.nch):
            if self.era.ring_list_wide:
                width = len(str(n - 1))
                line = f"Channel {ch:02d}/{c.nch:02d} :"
                for x in range(n):
                    item = f" {x:>{width}d}"
                    if len(line) + len(item) > 123 and x < n - 1:
                        line += " ..."
                        break
                    line += item
            else:
                shown = "".join(f" {x:3d}" for x in range(min(n, 20)))
                line = f"Channel {ch:02d}/{c.nch:02d} : {shown}"
            out.append(line)
        return out

    def _tree_line(self, c: _Comm, li: int) -> str:
        # A chain inside each node; node heads form a binary tree (NCCL's shape, with one
        # tree for every channel to keep it simple).
        nodes: list[list[int]] = []
        prev_host = -1
        where: tuple[int, int] = (0, 0)
        for i, g in enumerate(c.members):
            host = self.ranks[g].host_index
            if host != prev_host:
                nodes.append([])
                prev_host = host
            if i == li:
                where = (len(nodes) - 1, len(nodes[-1]))
            nodes[-1].append(i)
        node, k = where
        mine = nodes[node]
        downs = [mine[k + 1]] if k + 1 < len(mine) else []
        if k == 0:
            up = nodes[(node - 1) // 2][0] if node > 0 else -1
            downs += [nodes[x][0] for x in (2 * node + 1, 2 * node + 2) if x < len(nodes)]
        else:
            up = mine[k - 1]
        d = "/".join(str(x) for x in (*downs, -1, -1, -1)[:3])
        entry = f"{d}->{li}->{up}|{up}->{li}->{d}" if self.era.trees_double else f"{d}->{li}->{up}"
        return "Trees" + "".join(f" [{ch}] {entry}" for ch in range(c.nch))

    def _conn_lines(self, c: _Comm, li: int) -> list[str]:
        n = len(c.members)
        if n < 2:
            return []
        era = self.era
        me = self.ranks[c.members[li]]
        nj, pj = (li + 1) % n, (li - 1) % n
        nxt, prv = self.ranks[c.members[nj]], self.ranks[c.members[pj]]
        nic = me.local * _N_NICS // self.rph

        def ends(a: int, ra: _Rank, b: int, rb: _Rank, ch: int) -> str:
            if era.conn_busid:
                return f"Channel {ch:02d} : {a}[{ra.bus}] -> {b}[{rb.bus}]"
            return f"Channel {ch:02d}/0 : {a}[{ra.local}] -> {b}[{rb.local}]"

        out = []
        for ch in range(c.nch):
            if nxt.host_index == me.host_index:
                out.append(f"{ends(li, me, nj, nxt, ch)} via {era.p2p}")
            else:
                out.append(f"{ends(li, me, nj, nxt, ch)} [send] via NET/IB/{nic}{era.gdr}")
            if prv.host_index != me.host_index:
                out.append(f"{ends(pj, prv, li, me, ch)} [receive] via NET/IB/{nic}{era.gdr}")
        return out

    def _comm_body(self, c: _Comm, rk: _Rank) -> list[str]:
        """Messages between Init START and COMPLETE for one rank of one comm."""
        era = self.era
        rnd = self.rnd
        li = c.index(rk.rank)
        out: list[str] = []
        if era.bootstrap_timings:
            create, send, recv = (rnd.uniform(0.00002, 0.0002) for _ in range(3))
            ring = rnd.uniform(0.0005, 0.004)
            total = create + send + recv + ring + 0.00001
            out.append(
                f"Bootstrap timings total {total:f} (create {create:f}, send {send:f}, "
                f"recv {recv:f}, ring {ring:f}, delay 0.000000)"
            )
        mask = (
            "0000ffff,ffffffff"
            if rk.local < max(1, self.rph // 2)
            else "ffffffff,ffff0000,00000000"
        )
        out.append(f"Setting affinity for GPU {rk.local} to {mask}")
        if era.nvls_line:
            out.append(f"NVLS multicast support is not available on dev {rk.local}")
        if era.nnodes_line:
            same = [g for g in c.members if self.ranks[g].host_index == rk.host_index]
            out.append(
                f"comm {c.ptr[rk.rank]} rank {li} nRanks {len(c.members)} nNodes {c.n_nodes} "
                f"localRanks {len(same)} localRank {same.index(rk.rank)} MNNVL 0"
            )
        if li == 0:
            out.extend(self._ring_list(c))
        out.append(self._tree_line(c, li))
        if era.chunksize:
            out.append(f"P2P Chunksize set to {131072 if c.n_nodes > 1 else 524288}")
        out.extend(self._conn_lines(c, li))
        if era.connected_rings is not None:
            out.append(era.connected_rings)
            out.append("Connected all trees")
        out.append(f"threadThresholds {era.thread_thresholds}")
        multi = c.n_nodes > 1
        out.append(era.channels.format(c=c.nch, p=32 if multi else 24, pp=2 if multi else 4))
        if era.launch_mode:
            out.append("Launch mode Parallel")
        return out

    def _net_lines(self, rk: _Rank, net: str) -> list[str]:
        if net == "IB":
            devs = "".join(f" [{i}]mlx5_{i}:1/IB" for i in range(_N_NICS))
            return [f"NET/IB : Using{devs}{self.era.ib_ro}; OOB eth0:{rk.ip}<0>"]
        return ["NET/IB : No device found.", f"NET/Socket : Using [0]eth0:{rk.ip}<0>"]

    def _init_timings(self, c: _Comm, li: int, total: float) -> str:
        r = self.rnd
        kernels, alloc, boot, allg = (r.uniform(0.01, 0.05) for _ in range(4))
        topo, conn = total * 0.3, total * 0.4
        rest = max(total - kernels - alloc - boot - allg - topo - conn, 0.0)
        return (
            f"Init timings - {c.func}: rank {li} nranks {len(c.members)} total {total:.2f} "
            f"(kernels {kernels:.2f}, alloc {alloc:.2f}, bootstrap {boot:.2f}, "
            f"allgathers {allg:.2f}, topo {topo:.2f}, graphs 0.00, "
            f"connections {conn:.2f}, rest {rest:.2f})"
        )

    def _init_events(self) -> list[list[tuple[float, str]]]:
        """Per rank, the (time, text) records of process start-up and comm inits."""
        era = self.era
        rnd = self.rnd
        events: list[list[tuple[float, str]]] = [[] for _ in range(self.n)]
        cursor = [self.t0 + rnd.uniform(0.0, 2.0) for _ in range(self.n)]

        def raw(r: int, make: Callable[[float], str], step: float = 0.0004) -> None:
            # Advance this process's clock first, then format the text at that time, so
            # printed timestamps and merge order agree.
            cursor[r] += step * (0.5 + rnd.random())
            events[r].append((cursor[r], make(cursor[r])))

        def info(r: int, msg: str, step: float = 0.0004) -> None:
            rk = self.ranks[r]
            raw(r, lambda t: self._info(rk, t, msg), step)

        for rk in self.ranks:
            r = rk.rank
            if self.noise_on:  # DeepSpeed says hello before anything touches NCCL
                raw(r, partial(self._ds_hello, r), 0.0)
                cursor[r] += 2.0
            info(r, "NCCL_SOCKET_IFNAME set by environment to eth0")
            if self.multi:
                info(r, "NCCL_IB_TIMEOUT set by environment to 22.")
            info(r, era.bootstrap.format(ifc="eth0", ip=rk.ip))

        net = "IB" if self.multi else "Socket"
        shown_banner = [False] * self.n
        net_ready = [False] * self.n
        t_comm = max(cursor) + 1.0
        self.t_world_init = t_comm
        # The world comm first, then all host comms at once (like PyTorch subgroups).
        for group in ([self.world], self.host_comms):
            ends: list[float] = []
            for c in group:
                span = 0.4 + 0.05 * len(c.members) ** 0.5 + (0.8 if c.n_nodes > 1 else 0.2)
                t_done = t_comm + span + rnd.uniform(0.0, 0.05)
                for g in c.members:
                    rk = self.ranks[g]
                    li = c.index(g)
                    cursor[g] = max(cursor[g], t_comm + rnd.uniform(0.0, 0.3))
                    if not net_ready[g] and era.net_in_ncclinit:
                        for msg in (*era.net_plugin, *self._net_lines(rk, net)):
                            info(g, msg)
                        info(g, f"Using network {net}")
                    if li == 0 and not (era.banner_bare and shown_banner[g]):
                        if era.banner_bare and self.combined:
                            raw(g, partial(self._bare_banner, rk))
                        else:
                            # 2.23+ INFO banner, or the INFO copy that <= 2.22 writes to
                            # NCCL_DEBUG_FILE (its bare printf goes to stdout instead).
                            info(g, self._banner())
                        shown_banner[g] = True
                    msgs: list[str] = []
                    if not net_ready[g]:
                        if era.driver_version is not None:
                            msgs.append(f"cudaDriverVersion {era.driver_version}")
                        if not era.net_in_ncclinit:
                            msgs += era.net_plugin
                            if era.net_initialized:
                                msgs.append(f"Initialized NET plugin {net}")
                            msgs += self._net_lines(rk, net)
                        if era.ras_line and rk.local == 0:
                            msgs.append("RAS client listening socket at 127.0.0.1<28028>")
                        net_ready[g] = True
                    if era.net_assigned:
                        msgs.append(f"Assigned NET plugin {net} to comm")
                    if not era.net_in_ncclinit:
                        msgs.append(f"Using network {net}")
                    if era.init_start is not None:
                        msgs.append(self._init_line(era.init_start, c, rk, "START"))
                    for msg in msgs:
                        info(g, msg)
                    body = self._comm_body(c, rk)
                    gap = max(t_done - cursor[g] - 0.01, 0.01) / (len(body) + 1)
                    for msg in body:
                        info(g, msg, gap)
                    # COMPLETE is collective: every member finishes at about the same time.
                    cursor[g] = max(cursor[g], t_done)
                    info(g, self._init_line(era.init_complete, c, rk, "COMPLETE"), 0.004)
                    if era.init_timings:
                        info(g, self._init_timings(c, li, t_done - t_comm))
                ends.append(max(cursor[g] for g in c.members))
            t_comm = max(ends) + 0.3
        return events

    def _ds_hello(self, rank: int, t: float) -> str:
        if self.spec.framework == "torch":  # no DeepSpeed in a plain torch job
            return self.noise.emit(
                rank, f"[rank {rank}] init_process_group(backend='nccl', world_size={self.n})"
            )
        return self.noise.emit(
            rank,
            f"{self.noise.ds_ts(t + self.rank_off[rank])} [INFO] "
            "[real_accelerator.py:203:get_accelerator] "
            "Setting ds_accelerator to cuda (auto detect)",
        )

    def _bare_banner(self, rk: _Rank, _t: float) -> str:
        return f"{rk.head}{self._banner()}\n"

    def _end_events(self) -> list[list[tuple[float, str]]]:
        events: list[list[tuple[float, str]]] = [[] for _ in range(self.n)]
        fmt = self.era.end_line
        if fmt is None:
            return events
        for rk in self.ranks:
            t = self.last_t + 0.5 + self.rnd.uniform(0.0, 0.2)
            for c in (self.host_comms[rk.host_index], self.world):
                t += 0.003 + self.rnd.uniform(0.0, 0.002)
                line = fmt.format(
                    comm=c.ptr[rk.rank],
                    rank=c.index(rk.rank),
                    nranks=len(c.members),
                    dev=rk.local,
                    bus=rk.bus,
                    what="Destroy",
                )
                events[rk.rank].append((t, self._info(rk, t, line)))
        return events

    # ---- output plumbing -------------------------------------------------------------

    def _open_sinks(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.combined:
            sink = _Sink(self.out_dir / COMBINED_FILE, COMBINED_FILE)
            self.sinks = [sink]
            self.rank_sink = [sink] * self.n
        else:
            self.sinks = [_Sink(self.out_dir / rk.file, rk.file) for rk in self.ranks]
            self.rank_sink = list(self.sinks)

    def _emit_events(self, events: list[list[tuple[float, str]]]) -> None:
        """Write per-rank event lists; the combined layout merges them by time."""
        if self.combined:
            merged = sorted(
                (t, r, i, text) for r, evs in enumerate(events) for i, (t, text) in enumerate(evs)
            )
            sink = self.sinks[0]
            for t, _, _, text in merged:
                sink.add(text)
                self._touch(t)
        else:
            for r, evs in enumerate(events):
                for t, text in evs:
                    self.rank_sink[r].add(text)
                    self._touch(t)
        self._flush_all()

    def _flush_all(self) -> int:
        for s in self.sinks:
            s.flush()
        return sum(s.bytes for s in self.sinks)

    def _draw_delays(self) -> None:
        """Pick ``jitter_events`` distinct (world instance, rank) pairs and their delays."""
        count = self.spec.jitter_events
        if not count:
            return
        rnd = random.Random(self.spec.seed * 7919 + 5)
        span = self.spec.jitter_instances
        picked: dict[tuple[int, int], float] = {}
        while len(picked) < count:
            key = (rnd.randrange(span), rnd.randrange(self.n))
            if key not in picked:
                picked[key] = rnd.uniform(0.005, 0.05)
        wps = self.spec.world_per_step
        for (instance, r), delay in sorted(picked.items()):
            self.delays.setdefault(instance, []).append((r, delay))
            rk = self.ranks[r]
            call = self._world_call(instance)
            self.noise_events.append(
                {
                    "kind": "delay",
                    "rank": r,
                    "host": rk.host,
                    "pid": rk.pid,
                    "instance": instance,
                    "step": instance // wps,
                    "op": call.op,
                    "count": call.count_of(self.n),
                    "delay_s": delay,
                }
            )

    def _world_call(self, instance: int) -> _Call:
        j = instance % self.spec.world_per_step
        return [call for call in self.prog if call.world][j]
