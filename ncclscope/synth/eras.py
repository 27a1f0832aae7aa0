"""Era formats: a dispatch table per source (NCCL, DeepSpeed, PyTorch), no version checks below."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class _EraFormat:
    nccl_version: str
    cuda_version: str
    driver_version: int | None  # "cudaDriverVersion %d" (2.13.4+)
    bootstrap: str  # {ifc} {ip}
    net_plugin: tuple[str, ...]  # once per process, before NET/IB
    net_initialized: bool  # "Initialized NET plugin %s" (2.27+)
    net_assigned: bool  # "Assigned NET plugin %s to comm" (2.27+)
    net_in_ncclinit: bool  # <=2.11: network set up by ncclInit, before the banner
    ib_ro: str  # relaxed-ordering tag (2.12+) in the NET/IB line
    banner_bare: bool  # <=2.22: printf once per process; 2.23+: INFO at each rank-0 init
    init_start: str | None  # format with {func} {comm} {rank} {nranks} {dev} {nvml} {bus} {cid}
    init_complete: str
    has_commid: bool
    world_func: str
    host_func: str
    nnodes_line: bool
    nvls_line: bool
    ring_list_wide: bool  # 2.23+: width = digits(nranks-1), capped at 127 chars
    trees_double: bool  # 2.5-2.7 "d/d/d->r->up|up->r->d/d/d"
    conn_busid: bool  # <=2.18.1 peers shown as busId; 2.18.3+ as nvmlDev, with /connIndex
    p2p: str
    gdr: str
    chunksize: bool
    connected_rings: str | None
    thread_thresholds: str
    channels: str  # {c} {p} {pp}
    launch_mode: bool
    bootstrap_timings: bool
    init_timings: bool
    ras_line: bool
    end_line: str | None  # "comm %p rank ... busId %lx - %s COMPLETE" (2.12+)
    ib_error: str  # {peer} {status} {opcode} {vendor} {req} {gids} {hca}
    ib_file: str
    ib_line: int
    ib_code: int
    chain: tuple[str, ...]
    chain_last_suffix: str
    # Benign IB async event (ncclIbAsyncThreadMain): {hca} {port} {event}
    async_warn: str
    async_src: str
    timestamps_supported: bool
    warn_default_ts: bool
    opcount_zero_single_node: bool
    # 2.26.x: the %Nf sub-second digits come from tv_nsec / (1000000 / 10^N) (2.27 divides
    # 1000000000): with N = 6 that is the nanosecond count, printed into N characters.
    subsec_bug: bool = False


_INIT_218 = (
    "comm {comm} rank {rank} nranks {nranks} cudaDev {dev} nvmlDev {nvml} busId {bus} "
    "commId {cid} - Init {what}"
)
_INIT_221 = "ncclCommInitRank " + _INIT_218
_INIT_223 = "{func} " + _INIT_218
_END = "comm {comm} rank {rank} nranks {nranks} cudaDev {dev} busId {bus} - {what} COMPLETE"
_TT_OLD = "8/8/64 | 128/8/64 | 8/8/512"
_TT_NEW = "8/8/64 | 128/8/64 | 512 | 512"
_NOT_FOUND = "libnccl-net.so: cannot open shared object file: No such file or directory"
# ncclIbAsyncThreadMain prints every async event but COMM_EST and carries on:
#   <= 2.18  WARN("NET/IB : Got async event : %s", ibv_event_type_str(type))
#   by 2.20  WARN("NET/IB : %s:%d Got async event : %s", devName, portNum, str)  (2.20.5)
#   2.2x+    a switch: fatal QP/CQ/device events bump a counter that later fails the comm;
#            the non-fatal ones (PORT_ERR/ACTIVE, LID/PKEY/SM change, CLIENT_REREGISTER ...)
#            only print "NET/IB : %s:%d Got async error event: %s" (2.2x-era sources;
#            "Got non-fatal async event: %s(%d)" at HEAD).
# IBV_EVENT_SM_CHANGE ("SM change" in libibverbs) is benign in every era: the subnet manager
# moved (opensm failover/restart); existing RC queue pairs keep their LIDs and paths, so
# nothing fails and no "-> N" return-code chain follows. (GID_CHANGE, the other common one,
# got its own "GID table changed" case in 2.2x, at a release we could not pin down.)
_ASYNC_OLD = "NET/IB : Got async event : {event}"
_ASYNC_EVENT = "SM change"

_ERA_227 = _EraFormat(
    nccl_version="2.27.3",
    cuda_version="12.9",
    driver_version=12080,
    bootstrap="Bootstrap: Using {ifc}:{ip}<0>",
    net_plugin=(),
    net_initialized=True,
    net_assigned=True,
    net_in_ncclinit=False,
    ib_ro=" [RO]",
    banner_bare=False,
    init_start=_INIT_223,
    init_complete=_INIT_223,
    has_commid=True,
    # PyTorch creates its process groups with ncclCommInitRankConfig; the host-local
    # groups use plain ncclCommInitRank so that both 2.23+ spellings get exercised.
    world_func="ncclCommInitRankConfig",
    host_func="ncclCommInitRank",
    nnodes_line=True,
    nvls_line=True,
    ring_list_wide=True,
    trees_double=False,
    conn_busid=False,
    p2p="P2P/CUMEM/read",
    gdr="/GDRDMA(PCI)",
    chunksize=True,
    connected_rings="Connected all rings, use ring PXN 0 GDR 1",
    thread_thresholds=_TT_NEW,
    channels=(
        "{c} coll channels, 0 collnet channels, 0 nvls channels, {p} p2p channels, "
        "{pp} p2p channels per peer"
    ),
    launch_mode=False,
    bootstrap_timings=True,
    init_timings=True,
    ras_line=True,
    end_line=_END,
    ib_error=(
        "NET/IB: Got completion from peer {peer} with status={status} opcode={opcode} "
        "len=0 vendor err {vendor} ({req}){gids} hca {hca}"
    ),
    ib_file="transport/net_ib.cc",
    ib_line=2259,
    ib_code=6,
    chain=("transport/net_ib.cc:2262", "transport/net.cc:1373", "proxy.cc:746", "proxy.cc:958"),
    chain_last_suffix=" [Progress Thread]",
    async_warn="NET/IB : {hca}:{port} Got async error event: {event}",
    async_src="transport/net_ib.cc:198",
    timestamps_supported=True,
    warn_default_ts=True,
    opcount_zero_single_node=True,
)


_ERA_FORMATS: dict[str, _EraFormat] = {
    "2.7": _EraFormat(
        nccl_version="2.7.8",
        cuda_version="11.0",
        driver_version=None,
        bootstrap="Bootstrap : Using [0]{ifc}:{ip}<0>",
        net_plugin=(
            "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        ),
        net_initialized=False,
        net_assigned=False,
        net_in_ncclinit=True,
        ib_ro=" ",
        banner_bare=True,
        init_start=None,
        init_complete=(
            "comm {comm} rank {rank} nranks {nranks} cudaDev {dev} busId {bus} - Init {what}"
        ),
        has_commid=False,
        world_func="",
        host_func="",
        nnodes_line=False,
        nvls_line=False,
        ring_list_wide=False,
        trees_double=True,
        conn_busid=True,
        p2p="P2P/IPC",
        gdr="/GDRDMA",
        chunksize=False,
        connected_rings=None,
        thread_thresholds=_TT_OLD,
        channels="{c} coll channels, {p} p2p channels, {pp} p2p channels per peer",
        launch_mode=True,
        bootstrap_timings=False,
        init_timings=False,
        ras_line=False,
        end_line=None,
        ib_error=(
            "NET/IB : Got completion with error {status}, opcode {opcode}, len 0, "
            "vendor err {vendor}"
        ),
        ib_file="transport/net_ib.cc",
        ib_line=787,
        ib_code=2,
        chain=("transport/net_ib.cc:790", "transport/net.cc:405", "proxy.cc:196"),
        chain_last_suffix="",
        async_warn=_ASYNC_OLD,
        async_src="transport/net_ib.cc:83",
        timestamps_supported=False,
        warn_default_ts=False,
        opcount_zero_single_node=False,
    ),
    "2.18": _EraFormat(
        nccl_version="2.18.3",
        cuda_version="12.2",
        driver_version=12020,
        bootstrap="Bootstrap : Using {ifc}:{ip}<0>",
        net_plugin=(
            f"NET/Plugin : Plugin load (libnccl-net.so) returned 2 : {_NOT_FOUND}",
            "NET/Plugin : No plugin found, using internal implementation",
        ),
        net_initialized=False,
        net_assigned=False,
        net_in_ncclinit=False,
        ib_ro=" [RO]",
        banner_bare=True,
        init_start=_INIT_218,
        init_complete=_INIT_218,
        has_commid=True,
        world_func="",
        host_func="",
        nnodes_line=False,
        nvls_line=True,
        ring_list_wide=False,
        trees_double=False,
        conn_busid=False,
        p2p="P2P/IPC/read",
        gdr="/GDRDMA",
        chunksize=True,
        connected_rings="Connected all rings",
        thread_thresholds=_TT_NEW,
        channels="{c} coll channels, 0 nvls channels, {p} p2p channels, {pp} p2p channels per peer",
        launch_mode=False,
        bootstrap_timings=False,
        init_timings=False,
        ras_line=False,
        end_line=_END,
        ib_error=(
            "NET/IB : Got completion from peer {peer} with error {status}, opcode {opcode}, "
            "len 0, vendor err {vendor} ({req}){gids}"
        ),
        ib_file="transport/net_ib.cc",
        ib_line=1421,
        ib_code=6,
        chain=("transport/net_ib.cc:1424", "transport/net.cc:1225", "proxy.cc:715", "proxy.cc:864"),
        chain_last_suffix="",
        async_warn=_ASYNC_OLD,
        async_src="transport/net_ib.cc:93",
        timestamps_supported=False,
        warn_default_ts=False,
        opcount_zero_single_node=False,
    ),
    "2.21": _EraFormat(
        nccl_version="2.21.5",
        cuda_version="12.4",
        driver_version=12040,
        bootstrap="Bootstrap : Using {ifc}:{ip}<0>",
        net_plugin=(
            "NET/Plugin: No plugin found (libnccl-net.so)",
            f"NET/Plugin: Plugin load returned 2 : {_NOT_FOUND} : when loading libnccl-net.so",
            "NET/Plugin: Using internal network plugin.",
        ),
        net_initialized=False,
        net_assigned=False,
        net_in_ncclinit=False,
        ib_ro=" [RO]",
        banner_bare=True,
        init_start=_INIT_221,
        init_complete=_INIT_221,
        has_commid=True,
        world_func="ncclCommInitRank",
        host_func="ncclCommInitRank",
        nnodes_line=True,
        nvls_line=True,
        ring_list_wide=False,
        trees_double=False,
        conn_busid=False,
        p2p="P2P/CUMEM/read",
        gdr="/GDRDMA",
        chunksize=True,
        connected_rings="Connected all rings",
        thread_thresholds=_TT_NEW,
        channels=(
            "{c} coll channels, 0 collnet channels, 0 nvls channels, {p} p2p channels, "
            "{pp} p2p channels per peer"
        ),
        launch_mode=False,
        bootstrap_timings=False,
        init_timings=False,
        ras_line=False,
        end_line=_END,
        ib_error=(
            "NET/IB : Got completion from peer {peer} with status={status} opcode={opcode} "
            "len=0 vendor err {vendor} ({req}){gids}"
        ),
        ib_file="transport/net_ib.cc",
        ib_line=1696,
        ib_code=6,
        chain=("transport/net_ib.cc:1699", "transport/net.cc:1304", "proxy.cc:731", "proxy.cc:935"),
        chain_last_suffix=" [Progress Thread]",
        async_warn="NET/IB : {hca}:{port} Got async event : {event}",
        async_src="transport/net_ib.cc:101",
        timestamps_supported=False,
        warn_default_ts=False,
        opcount_zero_single_node=False,
    ),
    # 2.26.2 (what PyTorch 2.7 wheels ship). Against 2.27: no "Initialized/Assigned NET
    # plugin" lines (2.27+), the plugin fallback line that 2.26.2 prints instead (2.25.1
    # still said "internal network plugin", nccl.md's 2.22-2.25 wording), opCount = sequence
    # on single-node comms too (0 from 2.27), and the sub-second timestamp bug. The same
    # 2.23+ Init/timings lines, 2.24+ RAS and "use ring PXN", 2.26+ "/GDRDMA(PCI)" and
    # WARN timestamps. Bootstrap: formats/nccl.md puts "Bootstrap : Using" up to 2.26, but
    # real 2.25.1 and 2.26.2 logs print "Bootstrap: Using" (no space): we follow the logs.
    # 2.26 writes 2.27's formats but for the net plugin lines, where NET/IB is set up,
    # opCount on single-node communicators (2.27 prints 0) and the sub-second digits
    # of timestamps (nccl.md: 2.26.x prints the leading digits of the nanoseconds).
    "2.26": replace(
        _ERA_227,
        nccl_version="2.26.2",
        cuda_version="12.8",
        net_plugin=("NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.",),
        net_initialized=False,
        net_assigned=False,
        ib_line=2203,
        chain=("transport/net_ib.cc:2206", "transport/net.cc:1367", "proxy.cc:742", "proxy.cc:951"),
        async_src="transport/net_ib.cc:194",
        opcount_zero_single_node=False,
        subsec_bug=True,
    ),
    # 2.26.5: 2.26.2's lines with the sub-second digits right (src/debug.cc divides
    # tv_nsec by 1000000000 from 2.26.3 on).
    "2.26.5": replace(
        _ERA_227,
        nccl_version="2.26.5",
        cuda_version="12.8",
        net_plugin=("NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.",),
        net_initialized=False,
        net_assigned=False,
        ib_line=2203,
        chain=("transport/net_ib.cc:2206", "transport/net.cc:1367", "proxy.cc:742", "proxy.cc:951"),
        async_src="transport/net_ib.cc:194",
        opcount_zero_single_node=False,
    ),
    "2.27": _ERA_227,
}


# --------------------------------------------------------------------------------------
# DeepSpeed and PyTorch eras (shared/formats/deepspeed-torch.md)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _DsEraFormat:
    """What differs between DeepSpeed <= 0.10.0 and >= 0.10.1 (timer names, ``rank=N``)."""

    version: str
    timer_head: str  # "time (ms)" (>= 0.10.1) or "rank=0 time (ms)" (<= 0.10.0)
    micro: tuple[str, ...]  # engine micro-step timers, in log order
    glob: tuple[str, ...]  # engine global timers, in log order
    # Header "file:line:func" of each call site (line numbers of that release, D9).
    log_dist: str
    timer_stop: str
    mem: tuple[str, str, str]  # see_memory_usage: message, MA line, CPU line
    cfg_title: str
    cfg_line: str
    cfg_json: str
    stage12: int  # first line of the four stage_1_and_2 __init__ messages
    stage3: int  # first line of the two stage3 __init__ messages
    stage3_opt: str
    zero_utils: str
    newer_keys: bool  # config attributes that appeared after 0.10


_MICRO_NEW = (
    "fwd_microstep",
    "bwd_microstep",
    "bwd_inner_microstep",
    "bwd_allreduce_microstep",
    "step_microstep",
)
_GLOBAL_NEW = ("fwd", "bwd", "bwd_inner", "bwd_allreduce", "step")
# DeepSpeed <= 0.10.0 timer names -> >= 0.10.1 names (b354c28b7, #3996); the truth uses these.
_DS_RENAMES = {
    "forward_microstep": "fwd_microstep",
    "backward_microstep": "bwd_microstep",
    "backward_inner_microstep": "bwd_inner_microstep",
    "backward_allreduce_microstep": "bwd_allreduce_microstep",
    "forward": "fwd",
    "backward": "bwd",
    "backward_inner": "bwd_inner",
    "backward_allreduce": "bwd_allreduce",
}
_DS_OLD_NAMES = {new: old for old, new in _DS_RENAMES.items()}

_DS_ERA_FORMATS: dict[str, _DsEraFormat] = {
    "old": _DsEraFormat(
        version="0.9.5",
        timer_head="rank=0 time (ms)",
        micro=tuple(_DS_OLD_NAMES.get(x, x) for x in _MICRO_NEW),
        glob=tuple(_DS_OLD_NAMES.get(x, x) for x in _GLOBAL_NEW),
        log_dist="logging.py:96:log_dist",
        timer_stop="timer.py:199:stop",
        mem=(
            "utils.py:785:see_memory_usage",
            "utils.py:786:see_memory_usage",
            "utils.py:793:see_memory_usage",
        ),
        cfg_title="config.py:960:print",
        cfg_line="config.py:964:print",
        cfg_json="config.py:950:print_user_config",
        stage12=133,
        stage3=113,
        stage3_opt="stage3.py:436:_setup_for_real_optimizer",
        zero_utils="utils.py:54:is_zero_supported_optimizer",
        newer_keys=False,
    ),
    "new": _DsEraFormat(
        version="0.14.4",
        timer_head="time (ms)",
        micro=_MICRO_NEW,
        glob=_GLOBAL_NEW,
        log_dist="logging.py:96:log_dist",
        timer_stop="timer.py:258:stop",
        mem=(
            "utils.py:781:see_memory_usage",
            "utils.py:782:see_memory_usage",
            "utils.py:789:see_memory_usage",
        ),
        cfg_title="config.py:997:print",
        cfg_line="config.py:1001:print",
        cfg_json="config.py:987:print_user_config",
        stage12=148,
        stage3=130,
        stage3_opt="stage3.py:486:_setup_for_real_optimizer",
        zero_utils="utils.py:56:is_zero_supported_optimizer",
        newer_keys=True,
    ),
}


@dataclass(frozen=True)
class _TorchEraFormat:
    """One PyTorch generation of the NCCL watchdog and torchrun agent output (PART T)."""

    version: str
    rank_prefix: bool  # "[rankG]:" before C++ log lines (2.2+, #110623)
    glog_time: bool  # "[E314 09:41:52.117183842 file:N]" (2.4+) vs "[E file:N]"
    pg_prefix: str  # logPrefix() of the default PG, {r} = rank in it
    wd: int  # ProcessGroupNCCL.cpp line of each message
    exc_det: int | None  # "Exception (either an error or timeout) detected ..." (2.4)
    to_at: int | None  # "Timeout at NCCL work: ..." (2.3 - 2.6)
    fail_det: int | None  # "failure detected by watchdog at work sequence id" (2.7+)
    dump: tuple[int, int, int, int] | None  # 2.7: stack not found, first PG, received, preparing
    desync: int
    desync_prefixed: bool  # LOG(ERROR) << logPrefix() << report (2.3+) vs << report
    some: int
    avoid: int
    some_prefixed: bool  # "[Rank r] Some NCCL operations ..." (2.3+)
    term: int
    term_msg: str  # what the watchdog says when it throws
    term_pg_prefixed: bool
    check_timeout: int  # "Exception raised from checkTimeout at ...:N"
    comm_watchdog: int  # "Exception raised from ncclCommWatchdog at ...:N"
    optional: str  # c10::optional / std::optional in checkTimeout's signature
    loop: str  # the watchdog's loop function in the stack
    term_delay: tuple[float, float]  # from the timeout to the throw (2.4+ wait for dumps)
    # torchrun agent
    agent_glog: bool  # "E0314 09:41:52.117000 PID .../api.py:N] " (2.4+) vs "[... ,mmm] ..."
    agent_sigterm: int
    agent_failed: int
    monitor_interval_s: float  # torchrun --monitor-interval default
    tb_lines: tuple[int, int, int, int, int]  # errors/__init__ wrapper, run main/run, api


_TORCH_ERA_FORMATS: dict[str, _TorchEraFormat] = {
    "2.1": _TorchEraFormat(
        version="2.1.2",
        rank_prefix=False,
        glog_time=False,
        pg_prefix="[Rank {r}]",
        wd=475,
        exc_det=None,
        to_at=None,
        fail_det=None,
        dump=None,
        desync=486,
        desync_prefixed=False,
        some=489,
        avoid=495,
        some_prefixed=False,
        term=916,
        term_msg="NCCL watchdog thread terminated with exception: ",
        term_pg_prefixed=False,
        check_timeout=477,
        comm_watchdog=930,
        optional="c10::optional",
        loop="workCleanupLoop",
        term_delay=(0.001, 0.005),
        agent_glog=False,
        agent_sigterm=836,
        agent_failed=821,
        monitor_interval_s=5.0,
        tb_lines=(346, 806, 797, 134, 264),
    ),
    "2.4": _TorchEraFormat(
        version="2.4.1",
        rank_prefix=True,
        glog_time=True,
        pg_prefix="[PG 0 (default_pg) Rank {r}]",
        wd=607,
        exc_det=1664,
        to_at=1709,
        fail_det=None,
        dump=None,
        desync=1722,
        desync_prefixed=True,
        some=621,
        avoid=627,
        some_prefixed=True,
        term=1515,
        term_msg="Process group watchdog thread terminated with exception: ",
        term_pg_prefixed=True,
        check_timeout=609,
        comm_watchdog=1521,
        optional="std::optional",
        loop="watchdogHandler",
        term_delay=(0.5, 2.5),
        agent_glog=True,
        agent_sigterm=897,
        agent_failed=869,
        monitor_interval_s=0.1,
        tb_lines=(348, 901, 892, 133, 264),
    ),
    "2.7": _TorchEraFormat(
        version="2.7.1",
        rank_prefix=True,
        glog_time=True,
        pg_prefix="[PG ID 0 PG GUID 0(default_pg) Rank {r}]",
        wd=632,
        exc_det=None,
        to_at=None,
        fail_det=2268,
        dump=(670, 2305, 1743, 1533),
        desync=2280,
        desync_prefixed=True,
        some=684,
        avoid=698,
        some_prefixed=True,
        term=1902,
        term_msg="Process group watchdog thread terminated with exception: ",
        term_pg_prefixed=True,
        check_timeout=635,
        comm_watchdog=1908,
        optional="std::optional",
        loop="watchdogHandler",
        term_delay=(1.0, 3.0),
        agent_glog=True,
        agent_sigterm=900,
        agent_failed=874,
        monitor_interval_s=0.1,
        tb_lines=(355, 892, 883, 139, 270),
    ),
}
