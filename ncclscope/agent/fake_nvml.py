"""A programmable stand-in for the ``pynvml`` module (nvidia-ml-py 13.x) with no GPU behind it.

:class:`FakeNvml` is a module object with the part of pynvml's call surface that
:mod:`ncclscope.agent.nvml` uses, the same constants and the same ``NVMLError`` class
hierarchy (names and ``.value`` codes). It lives in the package, not under ``tests/``,
because the agent's replay/demo mode and the benchmarks use it too.

What it mirrors from NVML and pynvml:

* Units as NVML reports them: bytes for memory, percent (0-100) for utilization, KB/s for
  ``nvmlDeviceGetPcieThroughput``, milliwatts for power usage and the enforced limit,
  degrees Celsius for temperature, a ``unsigned long long`` bitmask for clocks-event reasons.
* ``nvmlDeviceGetPciInfo(h).busId`` is a ``str`` such as ``"00000000:3B:00.0"``: pynvml's
  ``_PrintableStructure`` decodes ``char[]`` fields, so nvidia-ml-py 13 returns ``str``.
  ``nvmlDeviceGetUUID`` and ``nvmlDeviceGetName`` return ``str`` as well.
* Every call before ``nvmlInit`` or after the last matching ``nvmlShutdown`` raises
  ``NVMLError_Uninitialized`` (NVML reference-counts init/shutdown).
* A function the driver lacks raises ``NVMLError_FunctionNotFound``, except the unversioned
  ``nvmlDeviceGetComputeRunningProcesses``, which pynvml turns into
  ``NVMLLibraryMismatchError`` (a plain ``Exception``, *not* an ``NVMLError``).
* A function the *binding* lacks (an older nvidia-ml-py) is simply absent:
  ``hasattr(fake, name)`` is false.
* Once a GPU is lost every call on its handle raises ``NVMLError_GpuIsLost``.

Example, two GPUs where GPU 1 has no power sensor:

>>> fake = FakeNvml([FakeGpu(), FakeGpu(not_supported={"nvmlDeviceGetPowerUsage"})])
>>> fake.nvmlInit()
>>> h = fake.nvmlDeviceGetHandleByIndex(1)
>>> fake.nvmlDeviceGetPciInfo(h).busId
'00000000:2A:00.0'
>>> fake.nvmlDeviceGetPowerUsage(h)
Traceback (most recent call last):
...
ncclscope.agent.fake_nvml.NVMLError_NotSupported: Not Supported
>>> fake.count("nvmlDeviceGetPowerUsage", 1)
1
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Collection, Iterable, Sequence
from types import ModuleType
from typing import Any, ClassVar, TypeAlias, TypeVar

__all__ = [
    "NVML_AGGREGATE_ECC",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_UNKNOWN",
    "NVML_MEMORY_ERROR_TYPE_CORRECTED",
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
    "NVML_PCIE_UTIL_RX_BYTES",
    "NVML_PCIE_UTIL_TX_BYTES",
    "NVML_TEMPERATURE_GPU",
    "NVML_TOPOLOGY_HOSTBRIDGE",
    "NVML_TOPOLOGY_INTERNAL",
    "NVML_TOPOLOGY_MULTIPLE",
    "NVML_TOPOLOGY_NODE",
    "NVML_TOPOLOGY_SINGLE",
    "NVML_TOPOLOGY_SYSTEM",
    "NVML_VOLATILE_ECC",
    "Dyn",
    "FakeGpu",
    "FakeHandle",
    "FakeNvml",
    "NVMLError",
    "NVMLError_DriverNotLoaded",
    "NVMLError_FunctionNotFound",
    "NVMLError_GpuIsLost",
    "NVMLError_InvalidArgument",
    "NVMLError_LibraryNotFound",
    "NVMLError_NoPermission",
    "NVMLError_NotSupported",
    "NVMLError_Uninitialized",
    "NVMLError_Unknown",
    "NVMLLibraryMismatchError",
    "busy_gpu",
]

# Values as in nvml.h / pynvml 13.615.71.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
# nvmlGpuTopologyLevel_t: how far apart two GPUs' PCIe paths join.
NVML_TOPOLOGY_INTERNAL = 0  # the same board
NVML_TOPOLOGY_SINGLE = 10  # behind one PCIe switch (nvidia-smi topo: PIX)
NVML_TOPOLOGY_MULTIPLE = 20  # behind several switches, no host bridge (PXB)
NVML_TOPOLOGY_HOSTBRIDGE = 30  # the same host bridge (PHB)
NVML_TOPOLOGY_NODE = 40  # the same NUMA node, across host bridges (NODE)
NVML_TOPOLOGY_SYSTEM = 50  # across NUMA nodes (SYS)
_TOPOLOGY_LEVELS = (0, 10, 20, 30, 40, 50)
#: ``nvmlEventTypeXidCriticalError``: the event mask bit of XID errors.
nvmlEventTypeXidCriticalError = 8

_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Base of every NVML error, as ``pynvml.NVMLError``: ``.value`` is the ``nvmlReturn_t``.

    As in pynvml, ``NVMLError(code)`` builds the subclass for that code when there is one,
    and the subclasses take no argument: ``NVMLError(3)`` is an ``NVMLError_NotSupported``.
    """

    value: int
    _code: ClassVar[int] = NVML_ERROR_UNKNOWN
    _by_value: ClassVar[dict[int, type[NVMLError]]] = {}

    def __new__(cls, value: int | None = None) -> NVMLError:
        code = value if value is not None else cls._code
        target = NVMLError._by_value.get(code, cls) if cls is NVMLError else cls
        obj = Exception.__new__(target)
        obj.value = code
        return obj

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")


_E = TypeVar("_E", bound=type[NVMLError])


def _code(value: int) -> Callable[[_E], _E]:
    def register(cls: _E) -> _E:
        cls._code = value
        NVMLError._by_value[value] = cls
        return cls

    return register


@_code(NVML_ERROR_UNINITIALIZED)
class NVMLError_Uninitialized(NVMLError):
    """NVML was not initialised (value 1)."""


@_code(NVML_ERROR_INVALID_ARGUMENT)
class NVMLError_InvalidArgument(NVMLError):
    """A bad argument, e.g. a device index past the count (value 2)."""


@_code(NVML_ERROR_NOT_SUPPORTED)
class NVMLError_NotSupported(NVMLError):
    """The device does not support this query (value 3)."""


@_code(NVML_ERROR_NO_PERMISSION)
class NVMLError_NoPermission(NVMLError):
    """Insufficient permissions (value 4)."""


@_code(NVML_ERROR_DRIVER_NOT_LOADED)
class NVMLError_DriverNotLoaded(NVMLError):
    """libnvidia-ml is present but the kernel driver is not loaded (value 9)."""


@_code(NVML_ERROR_LIBRARY_NOT_FOUND)
class NVMLError_LibraryNotFound(NVMLError):
    """libnvidia-ml.so.1 cannot be loaded: no driver installed (value 12)."""


@_code(NVML_ERROR_FUNCTION_NOT_FOUND)
class NVMLError_FunctionNotFound(NVMLError):
    """The driver's libnvidia-ml lacks this function: driver older than binding (value 13)."""


@_code(NVML_ERROR_TIMEOUT)
class NVMLError_Timeout(NVMLError):
    """nvmlEventSetWait found no event within its timeout (value 10)."""


@_code(NVML_ERROR_GPU_IS_LOST)
class NVMLError_GpuIsLost(NVMLError):
    """The GPU fell off the bus or otherwise became inaccessible (value 15)."""


@_code(NVML_ERROR_UNKNOWN)
class NVMLError_Unknown(NVMLError):
    """An internal driver error (value 999)."""


class NVMLLibraryMismatchError(Exception):
    """pynvml's error for an unversioned function whose versioned symbol the driver lacks."""


#: A dynamic value: a constant, or a function of how many times this device was asked for
#: it before (0 on the first call), so values can change from call to call deterministically.
Dyn: TypeAlias = int | Callable[[int], int]
_Procs: TypeAlias = tuple[tuple[int, int | None], ...]

_GIB = 1 << 30
_MIB = 1 << 20
_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


def _at(value: Dyn, n: int) -> int:
    return value(n) if callable(value) else value


@dataclasses.dataclass
class FakeGpu:
    """One simulated GPU, in NVML's own units. The defaults describe an idle H100 SXM.

    ``uuid`` and ``pci_bus_id`` default to values derived from the device index (filled in
    by :class:`FakeNvml`). Every ``Dyn`` field may be a function of the call number.

    Attributes:
        not_supported: pynvml function names that raise ``NVMLError_NotSupported`` on
            this device (e.g. ``{"nvmlDeviceGetTotalEccErrors"}`` for a board without ECC).
        lost_after_calls: the device answers this many calls (handle lookup excluded),
            then every later call raises ``NVMLError_GpuIsLost``. ``None``: never lost.
        pcie_switch: GPUs with the same number sit behind one PCIe switch
            (``NVML_TOPOLOGY_SINGLE`` between them); ``None``: attached to a root port
            of its own (``NVML_TOPOLOGY_NODE`` to every other GPU: one CPU).
    """

    uuid: str | None = None
    pci_bus_id: str | None = None
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total_bytes: int = 85_520_809_984  # 81559 MiB, as nvidia-smi shows for H100 SXM
    memory_used_bytes: Dyn = 4 * _MIB
    utilization_gpu_percent: Dyn = 0
    utilization_memory_percent: Dyn = 0
    pcie_tx_kb_per_s: Dyn = 0
    pcie_rx_kb_per_s: Dyn = 0
    pcie_link_gen: Dyn = 5
    pcie_link_width: Dyn = 16
    pcie_link_gen_max: int = 5
    pcie_link_width_max: int = 16
    clocks_event_reasons: Dyn = 0x1  # nvmlClocksEventReasonGpuIdle
    temperature_c: Dyn = 32
    power_usage_mw: Dyn = 70_000
    power_limit_mw: int = 700_000
    ecc_uncorrected_volatile: Dyn = 0
    ecc_corrected_volatile: Dyn = 0
    processes: _Procs | Callable[[int], _Procs] = ()
    not_supported: Collection[str] = frozenset()
    lost_after_calls: int | None = None
    pcie_switch: int | None = None


def busy_gpu(index: int) -> FakeGpu:
    """A GPU whose dynamic values move from call to call, deterministically by ``index``.

    Used by :meth:`FakeNvml.with_devices`, the demo and the benchmarks. Values stay in
    NVML's valid ranges (utilization 0-100, power under the limit, used <= total).
    """
    total = 85_520_809_984
    return FakeGpu(
        memory_used_bytes=lambda n: min(total, 60 * _GIB + ((n * 37 + index * 11) % 64) * _MIB),
        utilization_gpu_percent=lambda n: (n * 7 + index * 13) % 101,
        utilization_memory_percent=lambda n: (n * 5 + index * 3) % 101,
        pcie_tx_kb_per_s=lambda n: ((n * 7919 + index * 104_729) % 25_000) * 1000,
        pcie_rx_kb_per_s=lambda n: ((n * 6151 + index * 130_363) % 25_000) * 1000,
        clocks_event_reasons=lambda n: 0 if n % 10 else 0x4,  # SwPowerCap now and then
        temperature_c=lambda n: 45 + (n + index) % 30,
        power_usage_mw=lambda n: 300_000 + ((n * 13 + index * 7) % 400) * 1000,
        processes=((100_000 + index, 60 * _GIB),),
    )


@dataclasses.dataclass(frozen=True)
class FakeHandle:
    """What ``nvmlDeviceGetHandleByIndex`` returns (pynvml's is a ctypes pointer)."""

    index: int


@dataclasses.dataclass
class _MemoryInfo:
    """``c_nvmlMemory_t`` (v1): ``used`` includes memory the driver reserves."""

    total: int
    free: int
    used: int


@dataclasses.dataclass
class _Utilization:
    """``c_nvmlUtilization_t``: percent of the last sample period, 0-100."""

    gpu: int
    memory: int


@dataclasses.dataclass
class _PciInfo:
    """``nvmlPciInfo_t`` as pynvml 13 shows it (char fields decoded to ``str``)."""

    busIdLegacy: str
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int
    busId: str


@dataclasses.dataclass
class _ProcessInfo:
    """pynvml's friendly object for ``c_nvmlProcessInfo_v3_t``."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


#: The base error class under a name the :class:`FakeNvml` body does not shadow.
_BaseError = NVMLError


class _Absent:
    """A class attribute that is not there: makes ``hasattr(fake, name)`` false."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        raise AttributeError(f"module 'pynvml' has no attribute {self.name!r}")


@dataclasses.dataclass
class _DeviceState:
    calls: int = 0
    lost: bool = False


class FakeNvml(ModuleType):
    """A fake ``pynvml`` module over simulated GPUs; pass it as ``NvmlCollector(nvml=...)``.

    Args:
        devices: the GPUs, index = position. Use :meth:`with_devices` for N busy GPUs.
        init_error: an ``NVMLError`` subclass that ``nvmlInit`` raises every time, e.g.
            ``NVMLError_LibraryNotFound`` (no driver), ``NVMLError_DriverNotLoaded`` or
            ``NVMLError_NoPermission``.
        missing: functions the *driver* lacks (raise ``NVMLError_FunctionNotFound``).
        absent: functions the *binding* lacks (no such attribute on the module).
        virtual_machine: the GPUs are passed through to a VM (a flat PCI tree): the
            topology calls fail as they did on an H200 VM (checked 2026-11-26):
            ``nvmlDeviceGetTopologyNearestGpus`` raises ``InvalidArgument`` at every level,
            ``nvmlDeviceGetTopologyCommonAncestor`` raises ``NotSupported``.

    Attributes:
        calls: ``(function name, device index or None) -> number of calls``, counting
            every call made, including those that raised.
    """

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_Unknown = NVMLError_Unknown
    NVMLLibraryMismatchError = NVMLLibraryMismatchError

    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
    NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_CORRECTED = NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = NVML_AGGREGATE_ECC
    NVML_TOPOLOGY_INTERNAL = NVML_TOPOLOGY_INTERNAL
    NVML_TOPOLOGY_SINGLE = NVML_TOPOLOGY_SINGLE
    NVML_TOPOLOGY_MULTIPLE = NVML_TOPOLOGY_MULTIPLE
    NVML_TOPOLOGY_HOSTBRIDGE = NVML_TOPOLOGY_HOSTBRIDGE
    NVML_TOPOLOGY_NODE = NVML_TOPOLOGY_NODE
    NVML_TOPOLOGY_SYSTEM = NVML_TOPOLOGY_SYSTEM

    def __init__(
        self,
        devices: Sequence[FakeGpu] = (),
        *,
        init_error: type[_BaseError] | None = None,
        missing: Iterable[str] = (),
        absent: Iterable[str] = (),
        virtual_machine: bool = False,
    ) -> None:
        super().__init__("pynvml", "Fake pynvml (ncclscope.agent.fake_nvml).")
        self.virtual_machine = virtual_machine
        self.gpus: list[FakeGpu] = []
        for i, gpu in enumerate(devices):
            bus = _BUSES[i] if i < len(_BUSES) else f"{(0x100 - len(devices) + i) % 0x100:02X}"
            self.gpus.append(
                dataclasses.replace(
                    gpu,
                    uuid=gpu.uuid or f"GPU-5eed0000-0000-4000-8000-{i:012x}",
                    pci_bus_id=gpu.pci_bus_id or f"00000000:{bus}:00.0",
                    not_supported=frozenset(gpu.not_supported),
                )
            )
        self.init_error = init_error
        self.missing = frozenset(missing)
        self.calls: collections.Counter[tuple[str, int | None]] = collections.Counter()
        self._refcount = 0
        self._states = [_DeviceState() for _ in self.gpus]
        self._event_sets: list[_EventSet] = []
        gone = frozenset(absent)
        if gone:
            # A subclass per instance, so only this fake lacks those attributes.
            self.__class__ = type("FakeNvml", (FakeNvml,), {n: _Absent(n) for n in gone})

    @classmethod
    def with_devices(cls, n: int, *, gpus_per_switch: int = 1, **kwargs: Any) -> FakeNvml:
        """``n`` GPUs with moving values (:func:`busy_gpu`), ``gpus_per_switch`` of them
        behind each PCIe switch (1: each on a root port of its own); other arguments as
        the class."""
        gpus = [busy_gpu(i) for i in range(n)]
        if gpus_per_switch > 1:
            gpus = [
                dataclasses.replace(g, pcie_switch=i // gpus_per_switch) for i, g in enumerate(gpus)
            ]
        return cls(gpus, **kwargs)

    # -- test helpers -----------------------------------------------------------------

    def count(self, name: str, index: int | None = None) -> int:
        """Calls made to ``name``: on device ``index``, or on all devices when ``None``."""
        if index is not None:
            return self.calls[(name, index)]
        return sum(v for (fn, _), v in self.calls.items() if fn == name)

    def inject_xid(self, index: int, xid: int) -> None:
        """GPU ``index`` reports XID ``xid`` (delivered to event sets registered for it)."""
        for event_set in self._event_sets:
            if index in event_set.devices:
                event_set.queue.append(
                    _Event(FakeHandle(index), nvmlEventTypeXidCriticalError, xid)
                )

    def lose(self, index: int) -> None:
        """Make GPU ``index`` lost now: every later call on it raises ``GpuIsLost``."""
        self._states[index].lost = True

    @property
    def initialised(self) -> bool:
        """Whether NVML is initialised (init count above shutdown count)."""
        return self._refcount > 0

    # -- plumbing ---------------------------------------------------------------------

    def _enter(self, name: str, index: int | None = None) -> None:
        self.calls[(name, index)] += 1
        if self._refcount <= 0:
            raise NVMLError_Uninitialized
        if name in self.missing:
            if name == "nvmlDeviceGetComputeRunningProcesses":
                raise NVMLLibraryMismatchError(
                    "Unversioned function called and the pyNVML version does not match the "
                    "NVML lib version."
                )
            raise NVMLError_FunctionNotFound

    def _device(self, name: str, handle: FakeHandle) -> tuple[FakeGpu, int]:
        """Book one call of ``name`` on ``handle``; return the GPU and the call's number."""
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            self.calls[(name, None)] += 1
            raise NVMLError_InvalidArgument
        index = handle.index
        n = self.calls[(name, index)]
        self._enter(name, index)
        gpu, state = self.gpus[index], self._states[index]
        state.calls += 1
        if gpu.lost_after_calls is not None and state.calls > gpu.lost_after_calls:
            state.lost = True
        if state.lost:
            raise NVMLError_GpuIsLost
        if name in gpu.not_supported:
            raise NVMLError_NotSupported
        return gpu, n

    # -- pynvml surface ---------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls[("nvmlInit", None)] += 1
        if self.init_error is not None:
            raise self.init_error()
        self._refcount += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._refcount -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument
        return FakeHandle(index)

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        gpu, _ = self._device("nvmlDeviceGetUUID", handle)
        return str(gpu.uuid)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        gpu, _ = self._device("nvmlDeviceGetName", handle)
        return gpu.name

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> _PciInfo:
        gpu, _ = self._device("nvmlDeviceGetPciInfo", handle)
        bus_id = str(gpu.pci_bus_id)
        domain, bus, devfn = bus_id.split(":")
        device = devfn.split(".")[0]
        return _PciInfo(
            busIdLegacy=bus_id[-12:],
            domain=int(domain, 16),
            bus=int(bus, 16),
            device=int(device, 16),
            pciDeviceId=0x233010DE,
            pciSubSystemId=0x16C110DE,
            busId=bus_id,
        )

    def nvmlDeviceGetMemoryInfo(
        self, handle: FakeHandle, version: int | None = None
    ) -> _MemoryInfo:
        gpu, n = self._device("nvmlDeviceGetMemoryInfo", handle)
        used = _at(gpu.memory_used_bytes, n)
        total = gpu.memory_total_bytes
        return _MemoryInfo(total=total, free=total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> _Utilization:
        gpu, n = self._device("nvmlDeviceGetUtilizationRates", handle)
        return _Utilization(
            gpu=_at(gpu.utilization_gpu_percent, n), memory=_at(gpu.utilization_memory_percent, n)
        )

    def nvmlDeviceGetPcieThroughput(self, device: FakeHandle, counter: int) -> int:
        """KB/s over NVML's 20 ms window; the call number counts TX and RX calls together.

        A ``Dyn`` for TX or RX therefore sees ``n // 2``: the tick number when a sampler
        reads both counters once per tick.
        """
        gpu, n = self._device("nvmlDeviceGetPcieThroughput", device)
        if counter == NVML_PCIE_UTIL_TX_BYTES:
            return _at(gpu.pcie_tx_kb_per_s, n // 2)
        if counter == NVML_PCIE_UTIL_RX_BYTES:
            return _at(gpu.pcie_rx_kb_per_s, n // 2)
        raise NVMLError_InvalidArgument

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeHandle) -> int:
        gpu, n = self._device("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        return _at(gpu.pcie_link_gen, n)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeHandle) -> int:
        gpu, n = self._device("nvmlDeviceGetCurrPcieLinkWidth", handle)
        return _at(gpu.pcie_link_width, n)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:
        gpu, _ = self._device("nvmlDeviceGetMaxPcieLinkGeneration", handle)
        return gpu.pcie_link_gen_max

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeHandle) -> int:
        gpu, _ = self._device("nvmlDeviceGetMaxPcieLinkWidth", handle)
        return gpu.pcie_link_width_max

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        gpu, n = self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return _at(gpu.clocks_event_reasons, n)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        """The pre-R535 name of the same bitmask (deprecated in nvidia-ml-py)."""
        gpu, n = self._device("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return _at(gpu.clocks_event_reasons, n)

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        gpu, n = self._device("nvmlDeviceGetTemperature", handle)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError_InvalidArgument
        return _at(gpu.temperature_c, n)

    def nvmlDeviceGetTemperatureV(self, handle: FakeHandle, sensor: int, version: int = 0) -> int:
        gpu, n = self._device("nvmlDeviceGetTemperatureV", handle)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError_InvalidArgument
        return _at(gpu.temperature_c, n)

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        gpu, n = self._device("nvmlDeviceGetPowerUsage", handle)
        return _at(gpu.power_usage_mw, n)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        gpu, _ = self._device("nvmlDeviceGetEnforcedPowerLimit", handle)
        return gpu.power_limit_mw

    def nvmlDeviceGetTotalEccErrors(
        self, handle: FakeHandle, errorType: int, counterType: int
    ) -> int:
        gpu, n = self._device("nvmlDeviceGetTotalEccErrors", handle)
        if counterType not in (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC):
            raise NVMLError_InvalidArgument
        if errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return _at(gpu.ecc_uncorrected_volatile, n)
        if errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return _at(gpu.ecc_corrected_volatile, n)
        raise NVMLError_InvalidArgument

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: FakeHandle, device2: FakeHandle) -> int:
        """Where two GPUs' PCIe paths join (``nvmlGpuTopologyLevel_t``).  NVML: Linux only;
        ``NotSupported`` where the device or OS cannot tell (a VM), ``InvalidArgument``
        for a bad handle."""
        gpu1, _ = self._device("nvmlDeviceGetTopologyCommonAncestor", device1)
        gpu2, _ = self._device("nvmlDeviceGetTopologyCommonAncestor", device2)
        if self.virtual_machine:
            raise NVMLError_NotSupported
        if device1.index == device2.index:
            return NVML_TOPOLOGY_INTERNAL
        if gpu1.pcie_switch is not None and gpu1.pcie_switch == gpu2.pcie_switch:
            return NVML_TOPOLOGY_SINGLE
        return NVML_TOPOLOGY_NODE

    def nvmlDeviceGetTopologyNearestGpus(self, device: FakeHandle, level: int) -> list[FakeHandle]:
        """The other GPUs whose path joins this one's at ``level`` or nearer.  NVML:
        ``InvalidArgument`` for a level outside ``nvmlGpuTopologyLevel_t``,
        ``NotSupported`` where the device or OS cannot tell."""
        self._device("nvmlDeviceGetTopologyNearestGpus", device)
        if level not in _TOPOLOGY_LEVELS or self.virtual_machine:
            raise NVMLError_InvalidArgument
        out = []
        for i in range(len(self.gpus)):
            if i == device.index:
                continue
            other = FakeHandle(i)
            gpu = self.gpus[device.index]
            near = (
                NVML_TOPOLOGY_SINGLE
                if gpu.pcie_switch is not None and gpu.pcie_switch == self.gpus[i].pcie_switch
                else NVML_TOPOLOGY_NODE
            )
            if near <= level:
                out.append(other)
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[_ProcessInfo]:
        gpu, n = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        procs = gpu.processes(n) if callable(gpu.processes) else gpu.processes
        return [_ProcessInfo(pid=pid, usedGpuMemory=used) for pid, used in procs]


@dataclasses.dataclass
class _Event:
    """``c_nvmlEventData_t``: the device, the event type and its data (the XID)."""

    device: FakeHandle
    eventType: int
    eventData: int


@dataclasses.dataclass
class _EventSet:
    devices: set[int] = dataclasses.field(default_factory=set)
    queue: list[_Event] = dataclasses.field(default_factory=list)


def _event_functions() -> None:
    """NVML's event-set calls, added to FakeNvml (XID critical errors only)."""

    def nvmlEventSetCreate(self: FakeNvml) -> _EventSet:
        self._enter("nvmlEventSetCreate")
        event_set = _EventSet()
        self._event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(
        self: FakeNvml, handle: FakeHandle, eventTypes: int, eventSet: _EventSet
    ) -> None:
        _gpu, _n = self._device("nvmlDeviceRegisterEvents", handle)
        if eventTypes & nvmlEventTypeXidCriticalError:
            eventSet.devices.add(handle.index)

    def nvmlEventSetWait_v2(self: FakeNvml, eventSet: _EventSet, timeoutms: int) -> _Event:
        self._enter("nvmlEventSetWait_v2")
        del timeoutms  # the fake never blocks
        if not eventSet.queue:
            raise NVMLError_Timeout
        return eventSet.queue.pop(0)

    def nvmlEventSetFree(self: FakeNvml, eventSet: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        if eventSet in self._event_sets:
            self._event_sets.remove(eventSet)

    for fn in (nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2, nvmlEventSetFree):
        setattr(FakeNvml, fn.__name__, fn)


_event_functions()
