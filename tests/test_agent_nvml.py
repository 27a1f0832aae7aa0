"""The NVML sampler against the fake pynvml, and once against the real one (no driver here).

The fake (``ncclscope.agent.fake_nvml``) is checked against the installed nvidia-ml-py
too: same error names and codes, same constants, every faked function present there.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging

import pynvml
import pytest

from ncclscope.agent import fake_nvml
from ncclscope.agent.fake_nvml import (
    FakeGpu,
    FakeNvml,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
    NVMLError_Unknown,
)
from ncclscope.agent.nvml import GpuSample, NvmlCollector, pcie_max_bytes_per_second

GIB = 1 << 30
LOGGER = "ncclscope.agent.nvml"
STATIC_CALLS = (
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetEnforcedPowerLimit",
)


def started(fake: FakeNvml, **kwargs: bool) -> NvmlCollector:
    collector = NvmlCollector(fake, **kwargs)
    assert collector.start() is None
    return collector


def info_records(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


# -- values and units ---------------------------------------------------------------------


def test_values_are_converted_to_base_units() -> None:
    gpu = FakeGpu(
        memory_used_bytes=3 * GIB,
        utilization_gpu_percent=42,
        pcie_tx_kb_per_s=1000,
        pcie_rx_kb_per_s=250,
        pcie_link_gen=4,
        pcie_link_width=8,
        pcie_link_gen_max=4,
        pcie_link_width_max=16,
        clocks_event_reasons=0x4 | 0x40,
        temperature_c=67,
        power_usage_mw=250_500,
        power_limit_mw=400_000,
        ecc_uncorrected_volatile=2,
        processes=((4242, 2 * GIB), (4343, None)),
    )
    fake = FakeNvml([FakeGpu(), gpu, FakeGpu()])
    collector = started(fake)

    samples = collector.sample()

    assert [s.index for s in samples] == [0, 1, 2]
    assert samples[1] == GpuSample(
        index=1,
        memory_used_bytes=3 * GIB,
        utilization_gpu_ratio=0.42,
        pcie_tx_bytes_per_second=1000 * 1024.0,
        pcie_rx_bytes_per_second=250 * 1024.0,
        pcie_link_gen=4,
        pcie_link_width=8,
        clocks_event_reasons=0x44,
        temperature_celsius=67.0,
        power_watts=250.5,
        ecc_uncorrected_total=2,
        processes=((4242, 2 * GIB), (4343, None)),
    )
    static = collector.statics[1]
    assert static.index == 1
    assert static.uuid == fake.gpus[1].uuid
    assert static.pci_bus_id == "00000000:2A:00.0"
    assert static.name == "NVIDIA H100 80GB HBM3"
    assert static.memory_total_bytes == 85_520_809_984
    assert (static.pcie_link_max_gen, static.pcie_link_max_width) == (4, 16)
    assert static.pcie_link_max_bytes_per_second == pytest.approx(16e9 * 16 * 128 / 130 / 8)
    assert static.power_limit_watts == 400.0
    assert collector.ok
    assert len({s.uuid for s in collector.statics}) == 3
    assert len({s.pci_bus_id for s in collector.statics}) == 3


def test_dynamic_values_follow_the_fake_call_by_call() -> None:
    fake = FakeNvml(
        [FakeGpu(utilization_gpu_percent=lambda n: 10 * n, pcie_tx_kb_per_s=lambda n: n)]
    )
    collector = started(fake)

    ratios = [collector.sample()[0].utilization_gpu_ratio for _ in range(4)]
    tx = [collector.sample()[0].pcie_tx_bytes_per_second for _ in range(2)]

    assert ratios == [0.0, 0.1, 0.2, 0.3]
    assert tx == [4 * 1024.0, 5 * 1024.0]


@pytest.mark.parametrize(
    ("gen", "width", "expected"),
    [
        (1, 16, 2.5e9 * 16 * 0.8 / 8),  # 4 GB/s
        (2, 16, 5e9 * 16 * 0.8 / 8),  # 8 GB/s
        (3, 16, 8e9 * 16 * 128 / 130 / 8),  # ~15.75 GB/s
        (4, 16, 16e9 * 16 * 128 / 130 / 8),  # ~31.5 GB/s
        (5, 16, 32e9 * 16 * 128 / 130 / 8),  # ~63 GB/s
        (6, 16, 64e9 * 16 * 128 / 130 / 8),
        (4, 4, 16e9 * 4 * 128 / 130 / 8),
    ],
)
def test_pcie_max_bytes_per_second(gen: int, width: int, expected: float) -> None:
    assert pcie_max_bytes_per_second(gen, width) == pytest.approx(expected)


@pytest.mark.parametrize(("gen", "width"), [(0, 16), (7, 16), (None, 16), (4, None)])
def test_pcie_max_bytes_per_second_unknown(gen: int | None, width: int | None) -> None:
    assert pcie_max_bytes_per_second(gen, width) is None


# -- read once, switch off, fall back ------------------------------------------------------


def test_static_facts_are_read_once_and_init_happens_once() -> None:
    fake = FakeNvml.with_devices(4)
    collector = started(fake)
    assert collector.start() is None  # idempotent

    for _ in range(5):
        assert len(collector.sample()) == 4

    assert fake.count("nvmlInit") == 1
    assert fake.count("nvmlDeviceGetCount") == 1
    for index in range(4):
        for name in STATIC_CALLS:
            assert fake.count(name, index) == 1, name
        assert fake.count("nvmlDeviceGetMemoryInfo", index) == 1 + 5  # total once, used per tick
        assert fake.count("nvmlDeviceGetUtilizationRates", index) == 5
        assert fake.count("nvmlDeviceGetPcieThroughput", index) == 2 * 5


def test_not_supported_switches_a_metric_off_for_that_device_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    no_power = FakeGpu(not_supported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEccErrors"})
    fake = FakeNvml([FakeGpu(), no_power, FakeGpu()])
    collector = started(fake)

    runs = [collector.sample() for _ in range(6)]

    assert all(run[1].power_watts is None and run[1].ecc_uncorrected_total is None for run in runs)
    assert all(run[1].temperature_celsius == 32.0 for run in runs)  # the rest still read
    assert all(run[0].power_watts == 70.0 and run[2].power_watts == 70.0 for run in runs)
    assert fake.count("nvmlDeviceGetPowerUsage", 1) == 1  # never called after the first
    assert fake.count("nvmlDeviceGetTotalEccErrors", 1) == 1
    assert fake.count("nvmlDeviceGetPowerUsage", 0) == 6
    assert all(collector.ok for _ in runs)  # NotSupported is not a failure
    messages = info_records(caplog)
    assert len(messages) == 2  # once each, not once per tick
    assert any("GPU 1" in m and "nvmlDeviceGetPowerUsage" in m for m in messages)
    assert any("GPU 1" in m and "ecc_uncorrected_total" in m for m in messages)


def test_static_not_supported_gives_none() -> None:
    fake = FakeNvml([FakeGpu(not_supported={"nvmlDeviceGetEnforcedPowerLimit"})])
    collector = started(fake)

    assert collector.statics[0].power_limit_watts is None
    assert collector.sample()[0].power_watts == 70.0


def test_clocks_reasons_fall_back_to_the_throttle_name_when_the_driver_lacks_it() -> None:
    fake = FakeNvml(
        [FakeGpu(clocks_event_reasons=0x8)], missing={"nvmlDeviceGetCurrentClocksEventReasons"}
    )
    collector = started(fake)

    values = [collector.sample()[0].clocks_event_reasons for _ in range(3)]

    assert values == [0x8, 0x8, 0x8]
    assert fake.count("nvmlDeviceGetCurrentClocksEventReasons", 0) == 1
    assert fake.count("nvmlDeviceGetCurrentClocksThrottleReasons", 0) == 3
    assert collector.ok


def test_clocks_reasons_use_the_old_name_when_the_binding_lacks_the_new_one() -> None:
    fake = FakeNvml(
        [FakeGpu(clocks_event_reasons=0x20)], absent={"nvmlDeviceGetCurrentClocksEventReasons"}
    )
    assert not hasattr(fake, "nvmlDeviceGetCurrentClocksEventReasons")
    collector = started(fake)

    assert collector.sample()[0].clocks_event_reasons == 0x20
    assert fake.count("nvmlDeviceGetCurrentClocksEventReasons") == 0


def test_function_not_found_with_no_fallback_switches_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake = FakeNvml.with_devices(
        2,
        missing={
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
            "nvmlDeviceGetComputeRunningProcesses",  # pynvml raises NVMLLibraryMismatchError
        },
    )
    collector = started(fake)

    runs = [collector.sample() for _ in range(3)]

    assert all(s.clocks_event_reasons is None and s.processes is None for r in runs for s in r)
    assert all(s.utilization_gpu_ratio is not None for r in runs for s in r)
    assert fake.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 2  # once per GPU
    assert fake.count("nvmlDeviceGetComputeRunningProcesses") == 2
    assert len(info_records(caplog)) == 4


def test_pcie_throughput_can_be_left_out() -> None:
    fake = FakeNvml.with_devices(2)
    collector = started(fake, pcie_throughput=False)

    sample = collector.sample()[0]

    assert sample.pcie_tx_bytes_per_second is None
    assert sample.pcie_link_gen == 5
    assert fake.count("nvmlDeviceGetPcieThroughput") == 0


# -- errors --------------------------------------------------------------------------------


def test_gpu_lost_mid_run_is_reported_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake = FakeNvml.with_devices(3)
    collector = started(fake)
    assert [s.index for s in collector.sample()] == [0, 1, 2]

    fake.lose(1)
    during = collector.sample()
    ok_during = collector.ok
    calls_on_1 = sum(v for (_, index), v in fake.calls.items() if index == 1)
    after = [collector.sample() for _ in range(3)]

    assert [s.index for s in during] == [0, 2]
    assert not ok_during  # the tick that lost it is not ok ...
    assert collector.lost == [1]
    assert all([s.index for s in run] == [0, 2] for run in after)
    assert sum(v for (_, index), v in fake.calls.items() if index == 1) == calls_on_1
    assert collector.ok  # ... later ticks over the remaining GPUs are
    assert len(collector.statics) == 3  # its static facts stay known
    warnings = info_records(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "GPU 1" in warnings[0]
    assert fake.gpus[1].uuid in warnings[0]


def test_lost_tick_is_not_ok_and_losing_every_gpu_stays_not_ok() -> None:
    fake = FakeNvml([FakeGpu(lost_after_calls=40)])
    collector = started(fake)

    results = []
    for _ in range(6):
        samples = collector.sample()
        results.append((len(samples), collector.ok))

    assert results[0] == (1, True)
    assert (0, False) in results
    assert results[-1] == (0, False)
    assert collector.lost == [0]


def test_gpu_lost_while_reading_static_facts() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu(lost_after_calls=2)])
    collector = started(fake)

    assert collector.lost == [1]
    assert [s.index for s in collector.statics] == [0]
    assert [s.index for s in collector.sample()] == [0]


def test_unreadable_identity_skips_the_device(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake = FakeNvml([FakeGpu(not_supported={"nvmlDeviceGetUUID"}), FakeGpu()])
    collector = started(fake)

    assert [s.index for s in collector.sample()] == [1]
    assert any("GPU 0 skipped" in m for m in info_records(caplog, logging.WARNING))


def test_unexpected_nvml_error_misses_one_value_and_keeps_the_metric(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    def flaky(n: int) -> int:
        if n in (1, 2):
            raise NVMLError_Unknown
        return 50

    fake = FakeNvml([FakeGpu(temperature_c=flaky)])
    collector = started(fake)

    temps, oks = [], []
    for _ in range(4):
        temps.append(collector.sample()[0].temperature_celsius)
        oks.append(collector.ok)

    assert temps == [50.0, None, None, 50.0]
    assert oks == [True, False, False, True]
    assert collector.errors_total == 2
    assert fake.count("nvmlDeviceGetTemperature", 0) == 4
    assert len(info_records(caplog, logging.WARNING)) == 1


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (NVMLError_LibraryNotFound, "no NVIDIA driver found"),
        (NVMLError_DriverNotLoaded, "no NVIDIA driver found"),
        (NVMLError_NoPermission, "no permission"),
        (NVMLError_Unknown, "NVML failed to initialise"),
    ],
)
def test_init_failure_gives_one_message_and_no_samples(error: type[NVMLError], words: str) -> None:
    fake = FakeNvml.with_devices(2, init_error=error)
    collector = NvmlCollector(fake)

    message = collector.start()

    assert message is not None
    assert words in message
    assert "GPU metrics off; host and log metrics on" in message
    assert collector.start() == message
    assert collector.sample() == []
    assert collector.sample() == []
    assert not collector.ok
    assert collector.statics == []
    assert fake.count("nvmlInit") == 1  # not retried every tick
    collector.close()
    collector.close()
    assert fake.count("nvmlShutdown") == 0


def test_sample_starts_lazily_and_library_not_found_never_raises() -> None:
    fake = FakeNvml.with_devices(1, init_error=NVMLError_LibraryNotFound)
    collector = NvmlCollector(fake)

    assert collector.sample() == []
    assert collector.start() is not None
    assert fake.count("nvmlInit") == 1


def test_no_gpu_is_a_message_and_nvml_is_shut_down() -> None:
    fake = FakeNvml([])
    collector = NvmlCollector(fake)

    message = collector.start()

    assert message is not None
    assert "no NVIDIA GPU" in message
    assert not fake.initialised
    assert collector.sample() == []


def test_close_shuts_down_once_and_ends_sampling() -> None:
    fake = FakeNvml.with_devices(2)
    with NvmlCollector(fake) as collector:
        assert len(collector.sample()) == 2
        assert fake.initialised
    collector.close()

    assert fake.count("nvmlShutdown") == 1
    assert not fake.initialised
    assert collector.sample() == []
    assert not collector.ok
    with pytest.raises(RuntimeError, match="after close"):
        collector.start()


def test_library_code_does_not_print(capsys: pytest.CaptureFixture[str]) -> None:
    collector = NvmlCollector(FakeNvml.with_devices(1, init_error=NVMLError_LibraryNotFound))
    collector.start()
    collector.sample()
    collector.close()
    collector = NvmlCollector(FakeNvml([FakeGpu(not_supported={"nvmlDeviceGetPowerUsage"})]))
    collector.sample()
    collector.close()

    assert capsys.readouterr() == ("", "")


# -- the fake against the real binding -----------------------------------------------------

ERROR_NAMES = (
    "NVMLError_Uninitialized",
    "NVMLError_InvalidArgument",
    "NVMLError_NotSupported",
    "NVMLError_NoPermission",
    "NVMLError_DriverNotLoaded",
    "NVMLError_LibraryNotFound",
    "NVMLError_FunctionNotFound",
    "NVMLError_GpuIsLost",
    "NVMLError_Unknown",
)


@pytest.mark.parametrize("name", ERROR_NAMES)
def test_fake_errors_match_pynvml(name: str) -> None:
    fake_cls = getattr(fake_nvml, name)
    real_cls = getattr(pynvml, name)

    assert fake_cls().value == real_cls().value
    assert str(fake_cls()) == str(real_cls())
    assert issubclass(fake_cls, fake_nvml.NVMLError)
    assert type(fake_nvml.NVMLError(real_cls().value)) is fake_cls  # NVMLError(code) maps


def test_fake_constants_match_pynvml() -> None:
    names = [n for n in fake_nvml.__all__ if n.startswith("NVML_")]
    assert names
    for name in names:
        assert getattr(fake_nvml, name) == getattr(pynvml, name), name


def test_fake_functions_exist_in_pynvml_with_compatible_parameters() -> None:
    named = [n for n in dir(FakeNvml) if n.startswith("nvml")]
    functions = [n for n in named if callable(getattr(FakeNvml, n))]
    assert len(functions) >= 20
    constants = [n for n in named if n not in functions]
    for name in constants:  # e.g. nvmlEventTypeXidCriticalError
        assert getattr(FakeNvml, name) == getattr(pynvml, name), name
    for name in functions:
        real = inspect.signature(getattr(pynvml, name))
        fake = inspect.signature(getattr(FakeNvml.with_devices(1), name))
        assert list(fake.parameters) == list(real.parameters), name


def test_fake_pci_bus_id_is_str_like_pynvml_13() -> None:
    info = pynvml.nvmlPciInfo_t()
    info.busId = b"00000000:3B:00.0"
    fake = FakeNvml([FakeGpu(pci_bus_id="00000000:3B:00.0")])
    fake.nvmlInit()

    fake_info = fake.nvmlDeviceGetPciInfo(fake.nvmlDeviceGetHandleByIndex(0))

    assert fake_info.busId == info.busId == "00000000:3B:00.0"
    assert type(fake_info.busId) is type(info.busId)


def test_fake_refuses_calls_before_init_like_nvml() -> None:
    fake = FakeNvml.with_devices(1)
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    fake.nvmlShutdown()
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


# -- the real binding on this machine ------------------------------------------------------


def real_nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_real_pynvml_without_driver_gives_the_clear_message() -> None:
    if real_nvml_works():
        pytest.skip("a real NVIDIA driver is present: nothing to degrade from")
    collector = NvmlCollector()

    message = collector.start()

    assert message is not None
    assert message.startswith("no NVIDIA driver found")
    assert collector.sample() == []
    assert not collector.ok
    collector.close()


@pytest.mark.gpu
def test_real_gpu_smoke() -> None:
    if not real_nvml_works():
        pytest.skip("no NVIDIA driver or GPU on this machine")
    with NvmlCollector() as collector:
        samples = collector.sample()
        statics = collector.statics
    assert samples
    assert [s.index for s in samples] == [s.index for s in statics]
    assert all(s.uuid.startswith("GPU-") for s in statics)
    assert all(s.pci_bus_id.count(":") == 2 for s in statics)
    assert all(s.memory_used_bytes is None or s.memory_used_bytes > 0 for s in samples)


def test_deprecated_pynvml_package_is_not_installed() -> None:
    """``pip install pynvml`` adds a FutureWarning to every ``import pynvml`` (error here)."""
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("pynvml")
    assert importlib.metadata.distribution("nvidia-ml-py")


def test_xid_events_are_counted_per_gpu() -> None:
    fake = FakeNvml.with_devices(2)
    gpus = NvmlCollector(fake)
    assert gpus.start() is None
    gpus.sample()
    assert gpus.xid_counts == {}
    fake.inject_xid(1, 79)  # fell off the bus
    fake.inject_xid(1, 79)
    fake.inject_xid(0, 48)  # double-bit ECC
    gpus.sample()
    assert gpus.xid_counts == {(1, 79): 2, (0, 48): 1}
    gpus.sample()  # drained: nothing new
    assert gpus.xid_counts == {(1, 79): 2, (0, 48): 1}
    gpus.close()
    assert fake.count("nvmlEventSetFree") == 1
