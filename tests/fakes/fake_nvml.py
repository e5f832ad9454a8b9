"""FAKE NVML: a stand-in for the ``pynvml`` module that replays recorded-style GPU samples.

This machine has no NVIDIA GPU, so the NVML probe's tests run against this fake. It implements the subset
of the pynvml API that probes/nvml.py calls, with the same names, argument orders, units (percent, bytes,
MHz, milliwatts, KB/s) and error behaviour (raising ``NVMLError`` for unsupported queries).

Replay: each GPU has a list of frames (dicts, see ``frame``). A call to ``nvmlDeviceGetUtilizationRates``
for a GPU moves that GPU to its next frame (the probe calls it once per sample); every other getter reads
the current frame. The last frame repeats. ``scenario(name)`` builds typical recordings with numbers of an
H100 SXM (80 GB, 700 W, 1980 MHz SM max).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_GPM_METRICS_GET_VERSION = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12


class NVMLError(Exception):
    def __init__(self, value: int, text: str = "") -> None:
        super().__init__(text or f"NVML error {value}")
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's name
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found")


def frame(util: float = 90, mem_util: float = 40, mem_used_gib: float = 60, sm_clock: int = 1980,
          mem_clock: int = 2619, throttle: int = 0, power_w: float = 550, temp: int = 65,
          pcie_tx_kb: int = 2000, pcie_rx_kb: int = 8000, gpm: dict[int, float] | None = None,
          procs: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """One NVML reading in NVML's own units. ``gpm``: {metric id: percent}; None = GPM unsupported."""
    return {"util": util, "mem_util": mem_util, "mem_used": int(mem_used_gib * 2**30), "sm_clock": sm_clock,
            "mem_clock": mem_clock, "throttle": throttle, "power_mw": int(power_w * 1000), "temp": temp,
            "pcie_tx_kb": pcie_tx_kb, "pcie_rx_kb": pcie_rx_kb, "gpm": gpm, "procs": procs or []}


@dataclass
class FakeGpu:
    frames: list[dict[str, Any]]
    name: str = "NVIDIA H100 80GB HBM3"
    mem_total: int = 80 * 2**30
    power_limit_mw: int = 700_000
    sm_clock_max: int = 1980
    mem_clock_max: int = 2619
    nvlink: bool = True
    cursor: int = -1
    nvlink_kib: int = 0
    util_history: list[tuple[int, int]] = field(default_factory=list)

    @property
    def cur(self) -> dict[str, Any]:
        return self.frames[max(0, min(self.cursor, len(self.frames) - 1))]


class FakeNvml:
    """A fake pynvml module: pass ``FakeNvml(gpus)`` as ``NvmlProbe(nvml=...)``."""

    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = None  # set in __init__ (a class per instance keeps tests independent)

    def __init__(self, gpus: list[FakeGpu] | None = None, *, driver: bool = True) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu([frame()])]
        self.driver = driver
        self.inits = 0
        self.shutdowns = 0
        for k, v in globals().items():
            if k.startswith("NVML_"):
                setattr(self, k, v)

        class _Metric:
            def __init__(self) -> None:
                self.metricId = 0
                self.value = 0.0

        class MetricsGet:
            def __init__(self) -> None:
                self.version = 0
                self.numMetrics = 0
                self.sample1: Any = None
                self.sample2: Any = None
                self.metrics = [_Metric() for _ in range(98)]

        self.c_nvmlGpmMetricsGet_t = MetricsGet  # type: ignore[assignment]

    # -- lifecycle ---------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if not self.driver:
            raise NVMLError_LibraryNotFound()
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    # -- static ------------------------------------------------------------------------------------
    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return f"GPU-fake-{self.gpus.index(h)}"

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        return h.power_limit_mw

    def nvmlDeviceGetMaxClockInfo(self, h: FakeGpu, clock: int) -> int:
        return h.sm_clock_max if clock == NVML_CLOCK_SM else h.mem_clock_max

    # -- dynamic -----------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> SimpleNamespace:
        h.cursor += 1
        f = h.cur
        h.util_history.append((time.time_ns() // 1000, int(f["util"])))
        return SimpleNamespace(gpu=f["util"], memory=f["mem_util"])

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> SimpleNamespace:
        used = h.cur["mem_used"]
        return SimpleNamespace(total=h.mem_total, used=used, free=h.mem_total - used)

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        return int(h.cur["sm_clock"] if clock == NVML_CLOCK_SM else h.cur["mem_clock"])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return int(h.cur["throttle"])

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return int(h.cur["power_mw"])

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return int(h.cur["temp"])

    def nvmlDeviceGetPcieThroughput(self, h: FakeGpu, counter: int) -> int:
        return int(h.cur["pcie_tx_kb"] if counter == NVML_PCIE_UTIL_TX_BYTES else h.cur["pcie_rx_kb"])

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, ids: list[int]) -> list[SimpleNamespace]:
        if not h.nvlink:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        h.nvlink_kib += 1000
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=h.nvlink_kib)) for _ in ids]

    def nvmlDeviceGetSamples(self, h: FakeGpu, kind: int, since_us: int) -> tuple[int, list[SimpleNamespace]]:
        pts = [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=v))
               for t, v in h.util_history if t > since_us]
        return 1, pts

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in h.cur["procs"]]

    # -- GPM ---------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=int(any(f["gpm"] is not None for f in h.frames)))

    def nvmlGpmSampleAlloc(self) -> dict[str, Any]:
        return {}

    def nvmlGpmSampleGet(self, h: FakeGpu, sample: dict[str, Any]) -> dict[str, Any]:
        if h.cur["gpm"] is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        sample["gpm"] = dict(h.cur["gpm"])
        return sample

    def nvmlGpmSampleFree(self, sample: dict[str, Any]) -> None:
        sample.clear()

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        vals = mg.sample2.get("gpm") or {}
        for k in range(mg.numMetrics):
            mg.metrics[k].value = float(vals.get(mg.metrics[k].metricId, float("nan")))  # no reading: NaN
        return mg


def gpm(dram: float, sm: float, occ: float, tensor: float) -> dict[int, float]:
    """GPM metric values in percent, keyed by NVML metric id (10 DRAM BW, 2 SM util, 3 occupancy, 5 tensor)."""
    return {10: dram, 2: sm, 3: occ, 5: tensor}


def recorded(bundle_dir: str | Path) -> FakeNvml:
    """Replay a REAL recording: the NVML samples a capture bundle holds (``gpu_samples``, e.g. the H200
    captures in sample_traces/h200_*), turned back into NVML's own units, one frame per recorded sample."""
    from diagnose.io.bundle import open_bundle
    from diagnose.probes.nvml import GPM_METRICS

    recs = open_bundle(Path(bundle_dir)).records("gpu_samples")
    gpus = []
    for dev in [r for r in recs if r["kind"] == "device"]:
        i = dev["gpu"]
        frames = []
        for r in [r for r in recs if r["kind"] == "sample" and r["gpu"] == i]:
            g = {mid: r[key] * 100.0 for key, mid in GPM_METRICS.items()
                 if key in r} if dev.get("gpm_supported") else None  # {} -> NaN readings, as NVML gives
            frames.append(frame(util=round(r["util_gpu_ratio"] * 100), mem_util=round(r["util_mem_ratio"] * 100),
                                mem_used_gib=r["mem_used_bytes"] / 2**30, sm_clock=r["sm_clock_mhz"],
                                mem_clock=r["mem_clock_mhz"], throttle=r["throttle_reasons"], power_w=r["power_w"],
                                temp=r["temp_c"], pcie_tx_kb=int(r.get("pcie_tx_bytes_s", 0) // 1024),
                                pcie_rx_kb=int(r.get("pcie_rx_bytes_s", 0) // 1024), gpm=g))
        gpus.append(FakeGpu(frames, name=dev["name"], mem_total=dev["mem_total_bytes"],
                            power_limit_mw=int(dev["power_limit_w"] * 1000), sm_clock_max=dev["sm_clock_max_mhz"],
                            mem_clock_max=dev["mem_clock_max_mhz"], nvlink=False))
    return FakeNvml(gpus)


def scenario(name: str, n: int = 40) -> FakeNvml:
    """Typical recordings: busy, idle_gaps, throttled, membw_bound, no_gpm, two_gpus."""
    if name == "busy":
        frames = [frame(util=97, gpm=gpm(45, 80, 40, 60), procs=[(4242, 60 * 2**30)]) for _ in range(n)]
    elif name == "idle_gaps":
        frames = [frame(util=35 if i % 2 else 55, power_w=220, gpm=gpm(8, 20, 10, 8)) for i in range(n)]
    elif name == "throttled":
        # throttled in 3 of every 4 samples from the second on, so any number of samples taken (a loaded test
        # machine takes few in the capture's fraction of a second) shows both states in the same proportion
        frames = [frame(util=98, sm_clock=1980 if i % 4 == 0 else 1410, throttle=0x40 | 0x20 if i % 4 else 0,
                        temp=70 if i % 4 == 0 else 89, power_w=690, gpm=gpm(40, 85, 40, 55)) for i in range(n)]
    elif name == "membw_bound":
        frames = [frame(util=99, mem_util=85, gpm=gpm(91, 35, 20, 7)) for _ in range(n)]
    elif name == "no_gpm":
        frames = [frame(util=90, gpm=None) for _ in range(n)]
    elif name == "two_gpus":
        return FakeNvml([FakeGpu([frame(util=95, gpm=gpm(50, 80, 40, 50)) for _ in range(n)]),
                         FakeGpu([frame(util=20, power_w=150, gpm=gpm(5, 10, 5, 2)) for _ in range(n)])])
    else:
        raise ValueError(f"unknown fake NVML scenario {name!r}")
    return FakeNvml([FakeGpu(frames)])
