"""A stand-in for pynvml: one H100 SXM, or a machine without a driver, for tests without a GPU."""

from __future__ import annotations

import types


class NVMLError(Exception):
    pass


class Memory:
    def __init__(self, total, used):
        self.total = total
        self.used = used


class Util:
    def __init__(self, gpu, memory):
        self.gpu = gpu
        self.memory = memory


def make(*, driver: bool = True, unsupported: tuple[str, ...] = ()) -> types.ModuleType:
    """A fake pynvml module. `unsupported`: functions that raise NVMLError (not supported)."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_CLOCK_SM = 1
    m.NVML_CLOCK_MEM = 2
    m.NVML_TEMPERATURE_GPU = 0
    m.calls = []

    def fn(name, value):
        def call(*args):
            m.calls.append(name)
            if name in unsupported:
                raise NVMLError("Not Supported")
            return value(*args) if callable(value) else value

        setattr(m, name, call)

    def init():
        m.calls.append("nvmlInit")
        if not driver:
            raise NVMLError("NVML Shared Library Not Found")

    m.nvmlInit = init
    fn("nvmlShutdown", None)
    fn("nvmlSystemGetDriverVersion", "550.54.15")
    fn("nvmlDeviceGetCount", 1)
    fn("nvmlDeviceGetHandleByIndex", lambda i: ("handle", i))
    fn("nvmlDeviceGetName", b"NVIDIA H100 80GB HBM3")
    fn("nvmlDeviceGetMemoryInfo", lambda h: Memory(85_520_809_984, 1_048_576_000))
    fn("nvmlDeviceGetClockInfo", lambda h, kind: {1: 1980, 2: 2619}[kind])
    fn("nvmlDeviceGetMaxClockInfo", lambda h, kind: {1: 1980, 2: 2619}[kind])
    fn("nvmlDeviceGetMemoryBusWidth", 5120)
    fn("nvmlDeviceGetPowerUsage", 123_456)  # milliwatts
    fn("nvmlDeviceGetEnforcedPowerLimit", 700_000)
    fn("nvmlDeviceGetTemperature", 41)
    fn("nvmlDeviceGetCurrPcieLinkGeneration", 5)
    fn("nvmlDeviceGetCurrPcieLinkWidth", 16)
    fn("nvmlDeviceGetMaxPcieLinkGeneration", 5)
    fn("nvmlDeviceGetMaxPcieLinkWidth", 16)
    fn("nvmlDeviceGetUtilizationRates", lambda h: Util(87, 55))
    fn("nvmlDeviceGetCurrentClocksThrottleReasons", 0)
    fn("nvmlDeviceGetComputeRunningProcesses", [])
    return m
