"""GPU telemetry through NVML (nvidia-ml-py, imported as ``pynvml``), cheap and never fatal.

:class:`NvmlCollector` initialises NVML once, reads each GPU's static facts once
(:class:`GpuStatic`), then reads every dynamic value of every GPU in one pass per
:meth:`~NvmlCollector.sample` call (:class:`GpuSample`). The same values from the command line::

    nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.used,utilization.gpu,\\
pcie.link.gen.current,pcie.link.width.current,clocks_event_reasons.active,\\
temperature.gpu,power.draw,ecc.errors.uncorrected.volatile.total --format=csv

What it does when NVML cannot help:

* No driver (``NVMLError_LibraryNotFound`` / ``DriverNotLoaded``), no permission
  (``NoPermission``) or no GPU: :meth:`~NvmlCollector.start` returns one human message
  instead of raising, and :meth:`~NvmlCollector.sample` returns ``[]``.
* A query a GPU does not support (``NotSupported``), or that the driver lacks
  (``FunctionNotFound``, after trying the older name where there is one), is switched off
  for that GPU: logged once at INFO, never called again. Its field is ``None``.
* A GPU that raises ``GpuIsLost`` is listed in :attr:`~NvmlCollector.lost` (logged once
  at WARNING) and skipped from then on.
* Any other ``NVMLError`` gives ``None`` for that field in that sample only; it is counted
  (:attr:`~NvmlCollector.errors_total`) and makes :attr:`~NvmlCollector.ok` false.

The ``pynvml`` module comes in through the ``nvml=`` seam, so tests pass
:class:`ncclscope.agent.fake_nvml.FakeNvml`. Nothing here prints or configures logging.

Cost on real GPUs: ``nvmlDeviceGetPcieThroughput`` counts bytes over a 20 ms window per
call (NVML documentation), so the two PCIe counters add about 40 ms of wall time per GPU to
each sample. ``NvmlCollector(pcie_throughput=False)`` leaves them out.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import functools
import importlib
import logging
import threading
from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import Any

from ncclscope.units import PCIE_LANE_GT_PER_S, pcie_max_bytes_per_second

__all__ = [
    "PCIE_LANE_GT_PER_S",
    "GpuSample",
    "GpuStatic",
    "NvmlCollector",
    "pcie_max_bytes_per_second",
]

logger = logging.getLogger(__name__)

_KIB = 1024
_OFF = "GPU metrics off; host and log metrics on"


@dataclasses.dataclass(frozen=True)
class GpuStatic:
    """Facts about one GPU that do not change while the job runs, read once at start.

    Attributes:
        index: NVML's device index: dcgm-exporter's ``gpu`` label. Not the CUDA index,
            which ``CUDA_VISIBLE_DEVICES`` can reorder.
        uuid: ``GPU-...``: dcgm-exporter's ``UUID`` label.
        pci_bus_id: ``00000000:3B:00.0`` (domain:bus:device.function), as dcgm-exporter's
            ``pci_bus_id`` label prints it.
        name: the product name, e.g. ``NVIDIA H100 80GB HBM3``.
        memory_total_bytes: framebuffer size (``nvmlDeviceGetMemoryInfo().total``).
        pcie_link_max_gen: the highest PCIe generation this GPU *and slot* can train to.
        pcie_link_max_width: the widest link (lanes) this GPU *and slot* can train to.
        pcie_link_max_bytes_per_second: :func:`pcie_max_bytes_per_second` of the two.
        power_limit_watts: the enforced power limit (``nvmlDeviceGetEnforcedPowerLimit``,
            mW in NVML), ``None`` where the board does not report one.
    """

    index: int
    uuid: str
    pci_bus_id: str
    name: str
    memory_total_bytes: int | None
    pcie_link_max_gen: int | None
    pcie_link_max_width: int | None
    pcie_link_max_bytes_per_second: float | None
    power_limit_watts: float | None


@dataclasses.dataclass(frozen=True)
class GpuSample:
    """One GPU's dynamic values at one sample, in base units. ``None``: not available.

    Attributes:
        index: the GPU, as :attr:`GpuStatic.index`.
        memory_used_bytes: ``nvmlDeviceGetMemoryInfo().used`` (includes driver-reserved).
        utilization_gpu_ratio: share of the last sample period (1/6 s to 1 s, by product)
            in which a kernel ran, 0-1 (NVML gives percent).
        pcie_tx_bytes_per_second: PCIe bytes sent by the GPU over NVML's 20 ms window
            (NVML gives KB/s, 1 KB = 1024 bytes).
        pcie_rx_bytes_per_second: PCIe bytes received, likewise.
        pcie_link_gen: the current PCIe generation (drops when the link idles or degrades).
        pcie_link_width: the current link width in lanes.
        clocks_event_reasons: bitmask of why clocks are below maximum
            (``nvmlClocksEventReason*``: 0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal,
            0x40 HW thermal, 0x80 HW power brake, ...).
        temperature_celsius: GPU die temperature in degrees Celsius.
        power_watts: board power draw (NVML gives mW).
        ecc_uncorrected_total: uncorrected ECC errors since the driver loaded (volatile).
        processes: ``(pid, used GPU memory in bytes or None)`` for each compute process;
            pids are the host's (outside any container's pid namespace).
    """

    index: int
    memory_used_bytes: int | None = None
    utilization_gpu_ratio: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_link_gen: int | None = None
    pcie_link_width: int | None = None
    clocks_event_reasons: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    ecc_uncorrected_total: int | None = None
    processes: tuple[tuple[int, int | None], ...] | None = None


def _processes(procs: Any) -> tuple[tuple[int, int | None], ...]:
    return tuple(
        (int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in procs
    )


@dataclasses.dataclass(frozen=True)
class _Spec:
    """One dynamic query: the sample field it fills and how.

    ``names`` are pynvml functions, preferred first; a later one is used when the binding
    lacks the earlier one or the driver raises ``FunctionNotFound`` for it. ``args`` are
    names of pynvml constants passed after the handle.
    """

    field: str
    names: tuple[str, ...]
    args: tuple[str, ...]
    convert: Callable[[Any], Any]


_SPECS: tuple[_Spec, ...] = (
    _Spec("memory_used_bytes", ("nvmlDeviceGetMemoryInfo",), (), lambda m: int(m.used)),
    _Spec("utilization_gpu_ratio", ("nvmlDeviceGetUtilizationRates",), (), lambda u: u.gpu / 100),
    _Spec(
        "pcie_tx_bytes_per_second",
        ("nvmlDeviceGetPcieThroughput",),
        ("NVML_PCIE_UTIL_TX_BYTES",),
        lambda kb: float(kb * _KIB),
    ),
    _Spec(
        "pcie_rx_bytes_per_second",
        ("nvmlDeviceGetPcieThroughput",),
        ("NVML_PCIE_UTIL_RX_BYTES",),
        lambda kb: float(kb * _KIB),
    ),
    _Spec("pcie_link_gen", ("nvmlDeviceGetCurrPcieLinkGeneration",), (), int),
    _Spec("pcie_link_width", ("nvmlDeviceGetCurrPcieLinkWidth",), (), int),
    _Spec(
        "clocks_event_reasons",
        ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
        (),
        int,
    ),
    _Spec(
        "temperature_celsius",
        # nvmlDeviceGetTemperature is deprecated (to go in CUDA 14) but in every driver today.
        ("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV"),
        ("NVML_TEMPERATURE_GPU",),
        float,
    ),
    _Spec("power_watts", ("nvmlDeviceGetPowerUsage",), (), lambda mw: mw / 1000),
    _Spec(
        "ecc_uncorrected_total",
        ("nvmlDeviceGetTotalEccErrors",),
        ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
        int,
    ),
    _Spec("processes", ("nvmlDeviceGetComputeRunningProcesses",), (), _processes),
)

_PCIE_FIELDS = frozenset({"pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"})

#: A spec with the ``(name, function)`` candidates a binding has and its constants' values.
_Available = tuple[_Spec, list[tuple[str, Callable[..., Any]]], tuple[Any, ...]]


@dataclasses.dataclass(slots=True, eq=False)
class _Probe:
    """A :class:`_Spec` bound to one GPU: ``call()`` runs the first candidate on its handle.

    ``candidates`` are ``(name, function)`` pairs the binding has, preferred first.
    """

    spec: _Spec
    candidates: list[tuple[str, Callable[..., Any]]]
    args: tuple[Any, ...]
    call: Callable[[], Any]

    @property
    def name(self) -> str:
        return self.candidates[0][0]


@dataclasses.dataclass(slots=True)
class _Device:
    static: GpuStatic
    handle: Any
    probes: list[_Probe]


class _State(enum.Enum):
    """Lifecycle of a collector.

    NEW: not started. RUNNING: NVML initialised, devices known. UNAVAILABLE: start found
    no usable NVML or GPU (message kept). CLOSED: ``close()`` ran.
    """

    NEW = "new"
    RUNNING = "running"
    UNAVAILABLE = "unavailable"
    CLOSED = "closed"


class _NeverRaisedError(Exception):
    """Stands in for an error class an older binding lacks: never raised."""


class _LostAtStartError(Exception):
    """Internal: the GPU raised GpuIsLost while its static facts were read."""


def _text(value: Any) -> str:
    """pynvml returns ``str`` (nvidia-ml-py >= 11.5); older bindings returned ``bytes``."""
    return value.decode() if isinstance(value, bytes) else str(value)


#: XID events taken per sample at most (a storm is counted over the next samples).
_MAX_EVENTS_PER_SAMPLE = 1000


class NvmlCollector:
    """Samples every GPU NVML can see; one instance per agent process.

    Args:
        nvml: the ``pynvml`` module, or a fake with its call surface. ``None``: import
            ``pynvml`` (nvidia-ml-py) on :meth:`start`.
        log: where to log switched-off metrics and lost GPUs; default this module's logger.
        pcie_throughput: also read PCIe TX/RX throughput (about 40 ms of NVML wall time per
            GPU per sample on real hardware, see the module docstring).

    Thread-safe: :meth:`sample` and :meth:`close` may be called from different threads.

    >>> from ncclscope.agent.fake_nvml import FakeNvml
    >>> with NvmlCollector(FakeNvml.with_devices(2)) as gpus:
    ...     [s.index for s in gpus.sample()], gpus.statics[1].pci_bus_id
    ([0, 1], '00000000:2A:00.0')
    """

    def __init__(
        self,
        nvml: ModuleType | None = None,
        *,
        log: logging.Logger | None = None,
        pcie_throughput: bool = True,
    ) -> None:
        self._nvml = nvml
        self._log = log if log is not None else logger
        self._specs = tuple(s for s in _SPECS if pcie_throughput or s.field not in _PCIE_FIELDS)
        self._lock = threading.Lock()
        self._state = _State.NEW
        self._message: str | None = None
        self._devices: list[_Device] = []
        self._statics: list[GpuStatic] = []
        self._lost: list[int] = []
        self._ok = False
        self._errors_total = 0
        self._warned: set[tuple[int, str, int]] = set()
        # Error classes of the module in use, set by start().
        self._error: type[Exception] = _NeverRaisedError
        self._not_supported: tuple[type[Exception], ...] = ()
        self._not_found: tuple[type[Exception], ...] = ()
        self._gpu_lost: type[Exception] = _NeverRaisedError
        # XID critical errors, from an NVML event set polled without blocking.
        self._events: Any = None
        self._xids: collections.Counter[tuple[int, int]] = collections.Counter()

    # -- public API -----------------------------------------------------------------------

    def start(self) -> str | None:
        """Initialise NVML and read every GPU's static facts, once.

        Returns:
            ``None`` when GPU metrics are on, else one line for the user saying why they
            are off, e.g. ``"no NVIDIA driver found (...): GPU metrics off; host and log
            metrics on"``. Later calls return the same answer without trying again.

        Raises:
            RuntimeError: after :meth:`close`.
        """
        with self._lock:
            return self._start_locked()

    @property
    def statics(self) -> list[GpuStatic]:
        """Static facts of the GPUs found at start, by index (lost ones included)."""
        return list(self._statics)

    def sample(self) -> list[GpuSample]:
        """Read every GPU still followed, one pass each; ``[]`` when NVML is unavailable.

        Starts the collector first if :meth:`start` was not called. Never raises for NVML
        errors (see the module docstring).
        """
        with self._lock:
            if self._state is _State.NEW:
                self._start_locked()
            if self._state is not _State.RUNNING:
                self._ok = False
                return []
            clean = True
            samples: list[GpuSample] = []
            for device in self._devices:
                sample, device_clean = self._sample_device(device)
                clean = clean and device_clean
                if sample is not None:
                    samples.append(sample)
            if len(samples) < len(self._devices):  # some GPU was lost during this pass
                lost = set(self._lost)
                self._devices = [d for d in self._devices if d.static.index not in lost]
            self._ok = clean and bool(self._devices)
            self._drain_events()
            return samples

    @property
    def module(self) -> ModuleType | None:
        """The ``pynvml`` module (or fake) in use; None before :meth:`start`."""
        return self._nvml

    @property
    def handles(self) -> dict[int, Any]:
        """Each followed GPU's NVML handle, by index (for one-off queries at start, such
        as ``ncclscope.agent.topology``)."""
        with self._lock:
            return {d.static.index: d.handle for d in self._devices}

    @property
    def xid_counts(self) -> dict[tuple[int, int], int]:
        """XID critical errors seen so far: ``(GPU index, XID) -> count``."""
        return dict(self._xids)

    @property
    def ok(self) -> bool:
        """Whether the last :meth:`sample` read every GPU it follows without an NVML error.

        ``NotSupported`` metrics do not count as errors. False before the first sample,
        when NVML is unavailable or closed, when a GPU was lost during that sample, and
        when no GPU is left. For ``ncclscope_scrape_collector_success{collector="nvml"}``.
        """
        return self._ok

    @property
    def lost(self) -> list[int]:
        """Indices of GPUs that raised ``GpuIsLost``, in the order they were lost."""
        return list(self._lost)

    @property
    def errors_total(self) -> int:
        """NVML errors other than NotSupported/FunctionNotFound/GpuIsLost seen so far."""
        return self._errors_total

    def close(self) -> None:
        """Shut NVML down if this collector initialised it; safe to call more than once."""
        with self._lock:
            if self._state is _State.RUNNING and self._nvml is not None:
                if self._events is not None:
                    try:
                        self._nvml.nvmlEventSetFree(self._events)
                    except self._error as err:
                        self._log.debug("nvmlEventSetFree failed: %s", err)
                    self._events = None
                try:
                    self._nvml.nvmlShutdown()
                except self._error as err:
                    self._log.debug("nvmlShutdown failed: %s", err)
            self._state = _State.CLOSED
            self._devices = []
            self._ok = False

    def __enter__(self) -> NvmlCollector:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- start ----------------------------------------------------------------------------

    def _start_locked(self) -> str | None:
        if self._state is _State.CLOSED:
            raise RuntimeError("NvmlCollector.start() after close()")
        if self._state is not _State.NEW:
            return self._message
        self._message = self._init()
        if self._message is None:
            self._state = _State.RUNNING
            self._open_events()
        else:
            self._state = _State.UNAVAILABLE
        return self._message

    def _init(self) -> str | None:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as err:
                self._log.debug("import pynvml failed: %s", err)
                return f"nvidia-ml-py is not installed (no module pynvml): {_OFF}"
        nvml = self._nvml
        self._error = nvml.NVMLError
        self._gpu_lost = nvml.NVMLError_GpuIsLost
        self._not_supported = (nvml.NVMLError_NotSupported,)
        self._not_found = (
            nvml.NVMLError_FunctionNotFound,
            getattr(nvml, "NVMLLibraryMismatchError", _NeverRaisedError),
        )
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as err:
            self._log.debug("nvmlInit: %r", err)
            return f"no NVIDIA driver found (libnvidia-ml.so.1 cannot be loaded): {_OFF}"
        except nvml.NVMLError_DriverNotLoaded as err:
            self._log.debug("nvmlInit: %r", err)
            return f"no NVIDIA driver found (NVML: the kernel driver is not loaded): {_OFF}"
        except nvml.NVMLError_NoPermission as err:
            self._log.debug("nvmlInit: %r", err)
            return (
                "no permission to use the NVIDIA driver (NVML: Insufficient Permissions; "
                f"the agent's user must be able to open /dev/nvidia*): {_OFF}"
            )
        except nvml.NVMLError as err:
            return f"NVML failed to initialise ({err}): {_OFF}"
        try:
            message = self._discover(nvml)
        except nvml.NVMLError as err:
            message = f"NVML could not list the GPUs ({err}): {_OFF}"
        if message is not None:
            self._devices, self._statics = [], []
            self._shutdown_quietly(nvml)
        return message

    def _discover(self, nvml: ModuleType) -> str | None:
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            return f"NVML found no NVIDIA GPU: {_OFF}"
        specs = self._available_specs(nvml)
        for index in range(count):
            device = self._open_device(nvml, index, specs)
            if device is not None:
                self._devices.append(device)
                self._statics.append(device.static)
        if not self._devices:
            return f"NVML sees {count} GPU(s) but none can be read (see the log): {_OFF}"
        return None

    def _available_specs(self, nvml: ModuleType) -> list[_Available]:
        """Specs this binding can serve, with its functions and resolved constants."""
        out: list[_Available] = []
        for spec in self._specs:
            names = [(n, getattr(nvml, n, None)) for n in spec.names]
            functions = [(n, fn) for n, fn in names if fn is not None]
            args = [getattr(nvml, a, None) for a in spec.args]
            if not functions or any(a is None for a in args):
                self._log.info(
                    "this nvidia-ml-py lacks %s: %s off on every GPU",
                    " and ".join(spec.names),
                    spec.field,
                )
                continue
            out.append((spec, functions, tuple(args)))
        return out

    def _open_device(
        self,
        nvml: ModuleType,
        index: int,
        specs: list[_Available],
    ) -> _Device | None:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            pci_bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
            name = _text(nvml.nvmlDeviceGetName(handle))
            memory_total = self._static(nvml, index, handle, "nvmlDeviceGetMemoryInfo")
            max_gen = self._static(nvml, index, handle, "nvmlDeviceGetMaxPcieLinkGeneration")
            max_width = self._static(nvml, index, handle, "nvmlDeviceGetMaxPcieLinkWidth")
            limit_mw = self._static(nvml, index, handle, "nvmlDeviceGetEnforcedPowerLimit")
        except (self._gpu_lost, _LostAtStartError):
            self._lost.append(index)
            self._log.warning("GPU %d is lost (NVML: GPU is lost): skipped", index)
            return None
        except nvml.NVMLError as err:
            self._log.warning("GPU %d skipped: NVML cannot read its identity (%s)", index, err)
            return None
        gen = None if max_gen is None else int(max_gen)
        width = None if max_width is None else int(max_width)
        static = GpuStatic(
            index=index,
            uuid=uuid,
            pci_bus_id=pci_bus_id,
            name=name,
            memory_total_bytes=None if memory_total is None else int(memory_total.total),
            pcie_link_max_gen=gen,
            pcie_link_max_width=width,
            pcie_link_max_bytes_per_second=pcie_max_bytes_per_second(gen, width),
            power_limit_watts=None if limit_mw is None else limit_mw / 1000,
        )
        probes = [
            _Probe(spec, list(functions), args, functools.partial(functions[0][1], handle, *args))
            for spec, functions, args in specs
        ]
        return _Device(static, handle, probes)

    def _static(self, nvml: ModuleType, index: int, handle: Any, name: str) -> Any:
        """One static query; ``None`` (logged once at INFO) where it is not available."""
        fn = getattr(nvml, name, None)
        if fn is None:
            self._log.info("GPU %d: this nvidia-ml-py lacks %s", index, name)
            return None
        try:
            return fn(handle)
        except self._gpu_lost as err:
            raise _LostAtStartError from err
        except (*self._not_supported, *self._not_found) as err:
            self._log.info("GPU %d: %s not available (%s)", index, name, err)
            return None
        except nvml.NVMLError as err:
            self._count_error(index, name, err)
            return None

    def _open_events(self) -> None:
        """Register every GPU for XID critical errors; GPUs (or drivers) that do not
        support events are logged once and left out."""
        nvml = self._nvml
        assert nvml is not None
        try:
            event_set = nvml.nvmlEventSetCreate()
        except (self._error, AttributeError) as err:
            self._log.info("XID events unavailable: %s", err)
            return
        registered = 0
        for device in self._devices:
            try:
                nvml.nvmlDeviceRegisterEvents(
                    device.handle, nvml.nvmlEventTypeXidCriticalError, event_set
                )
                registered += 1
            except self._error as err:
                self._log.info("GPU %d: XID events unavailable: %s", device.static.index, err)
        if registered:
            self._events = event_set
        else:
            with contextlib.suppress(self._error):
                nvml.nvmlEventSetFree(event_set)

    def _drain_events(self) -> None:
        """Take every XID event waiting, without blocking (timeout 0)."""
        if self._events is None or self._nvml is None:
            return
        nvml = self._nvml
        timeout: type[Exception] = getattr(nvml, "NVMLError_Timeout", _NeverRaisedError)
        by_uuid = {st.uuid: st.index for st in self._statics}
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
                uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
            except timeout:
                return
            except self._error as err:
                self._count_error(-1, "nvmlEventSetWait_v2", err)
                return
            index = by_uuid.get(uuid)
            if index is not None:
                self._xids[(index, int(event.eventData))] += 1

    def _shutdown_quietly(self, nvml: ModuleType) -> None:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as err:
            self._log.debug("nvmlShutdown failed: %s", err)

    # -- sample ---------------------------------------------------------------------------

    def _sample_device(self, device: _Device) -> tuple[GpuSample | None, bool]:
        """One pass over a GPU: its sample (``None`` if it was lost) and whether it was clean."""
        index = device.static.index
        values: dict[str, Any] = {}
        off: list[_Probe] = []
        clean = True
        for probe in device.probes:
            while True:
                try:
                    values[probe.spec.field] = probe.spec.convert(probe.call())
                except self._not_supported as err:
                    self._switch_off(index, probe, err)
                    off.append(probe)
                except self._not_found as err:
                    if self._fall_back(device, probe, err):
                        continue
                    off.append(probe)
                except self._gpu_lost:
                    self._mark_lost(device)
                    return None, False
                except self._error as err:
                    self._count_error(index, probe.name, err)
                    clean = False
                break
        if off:
            device.probes = [p for p in device.probes if all(p is not o for o in off)]
        return GpuSample(index=index, **values), clean

    def _switch_off(self, index: int, probe: _Probe, err: Exception) -> None:
        self._log.info(
            "GPU %d: %s not supported (%s): %s off for this GPU",
            index,
            probe.name,
            err,
            probe.spec.field,
        )

    def _fall_back(self, device: _Device, probe: _Probe, err: Exception) -> bool:
        """After FunctionNotFound, bind the next candidate name; False when none is left."""
        index = device.static.index
        missing, _ = probe.candidates.pop(0)
        if not probe.candidates:
            self._log.info(
                "GPU %d: the driver lacks %s (%s): %s off for this GPU",
                index,
                missing,
                err,
                probe.spec.field,
            )
            return False
        name, fn = probe.candidates[0]
        probe.call = functools.partial(fn, device.handle, *probe.args)
        self._log.debug("GPU %d: the driver lacks %s, using %s", index, missing, name)
        return True

    def _mark_lost(self, device: _Device) -> None:
        static = device.static
        self._lost.append(static.index)
        self._log.warning(
            "GPU %d (%s, %s) is lost (NVML: GPU is lost): skipped from now on",
            static.index,
            static.uuid,
            static.pci_bus_id,
        )

    def _count_error(self, index: int, name: str, err: Exception) -> None:
        """Count an unexpected NVML error; WARNING the first time per GPU, call and code."""
        self._errors_total += 1
        code = int(getattr(err, "value", -1))
        key = (index, name, code)
        if key in self._warned:
            self._log.debug("GPU %d: %s failed again: %s", index, name, err)
            return
        self._warned.add(key)
        self._log.warning(
            "GPU %d: %s failed (%s); the value is missing this time", index, name, err
        )
