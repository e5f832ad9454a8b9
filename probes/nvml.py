"""NVML GPU counters: sample every visible NVIDIA GPU during the capture (stream ``gpu_samples``).

``pynvml`` (package nvidia-ml-py, extra ``diagnose[gpu]``) is imported inside this probe only. No driver,
no library or no GPU makes the probe ``unavailable`` with the reason; analysis works without it.

Records (times CLOCK_MONOTONIC ns):
  device:  {kind, gpu, name, uuid, mem_total_bytes, power_limit_w, sm_clock_max_mhz, mem_clock_max_mhz,
            gpm_supported, util_samples}                                        once per GPU
  sample:  {kind, t_ns, gpu, util_gpu_ratio, util_mem_ratio, mem_used_bytes, mem_total_bytes, sm_clock_mhz,
            mem_clock_mhz, throttle_reasons, power_w, power_limit_w, temp_c, [pcie_tx_bytes_s,
            pcie_rx_bytes_s] (every ``pcie_interval_s``), nvlink_tx_bytes, nvlink_rx_bytes, [dram_bw_util_ratio,
            sm_util_ratio, sm_occupancy_ratio, tensor_util_ratio] (GPM)}       every 1/rate_hz; keys a GPU
            does not support, and values NVML returns as NaN, are left out (missing, never zero)
  util:    {kind, gpu, t_ns: [...], util_gpu_ratio: [...]}   driver-buffered utilisation samples
            (nvmlDeviceGetSamples once per second), only with ``util_samples=True``
  procs:   {kind, t_ns, gpu, procs: [{pid, used_bytes}]}     every ``procs_interval_s``

Costs measured on an H200 (driver 580, benchmarks/results/nvml_cost.md) set two choices:
- nvmlDeviceGetPcieThroughput blocks about 21 ms per call (NVML measures over a 20 ms window), so PCIe is
  read once per second, not every tick: two calls per tick capped the probe at about 23 Hz.
- nvmlDeviceGetSamples took 2.7 ms per call for the same 200 ms-resolution utilisation that 10 polls of
  nvmlDeviceGetUtilizationRates read in 0.04 ms, so polling is the default and the buffered samples are
  off unless asked for.

``util_gpu_ratio`` and ``util_mem_ratio`` are NVML's utilization.gpu / utilization.memory: the fraction of
the last sample period in which at least one kernel ran / device memory was read or written. They are time
fractions, not how full the SMs or the memory bus were; GPM's sm_util / dram_bw_util measure that.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any, Literal, TypedDict

from diagnose.capture.overhead import cost
from diagnose.capture.workload import parse_duration
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Options, ProbeOption, ProbeSetup, ProbeSpec

NAME = "nvml"
# clock-event (throttle) reasons that mean "slowed down" rather than idle or set by the user
THROTTLE_BITS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clock",
}
BENIGN_THROTTLE_MASK = 0x1 | 0x2 | 0x100
GPM_METRICS = {"dram_bw_util_ratio": 10, "sm_util_ratio": 2, "sm_occupancy_ratio": 3, "tensor_util_ratio": 5}

# A sample record ({kind: "sample", t_ns, gpu, then whichever counters the GPU gave}: see above) is flat, its
# keys depend on the GPU: numbers by name, and its kind (None only as mypy sees power_limit_w, copied from the
# device record after a .get() check).
Sample = dict[str, str | float | None]


class Device(TypedDict):
    """A device record, once per GPU."""

    kind: Literal["device"]
    gpu: int
    name: str
    uuid: str
    mem_total_bytes: int | None
    power_limit_w: float | None
    sm_clock_max_mhz: int | None
    mem_clock_max_mhz: int | None
    gpm_supported: bool
    util_samples: bool


class UtilSamples(TypedDict):
    """Driver-buffered utilisation samples of one GPU (``util_samples=True``)."""

    kind: Literal["util"]
    gpu: int
    t_ns: list[int]
    util_gpu_ratio: list[float]


class ProcUse(TypedDict):
    pid: int
    used_bytes: int


class Procs(TypedDict):
    """The compute processes on one GPU and the memory each holds."""

    kind: Literal["procs"]
    t_ns: int
    gpu: int
    procs: list[ProcUse]


def import_nvml() -> Any:
    import pynvml

    return pynvml


class NvmlProbe:
    name = NAME

    def __init__(self, *, rate_hz: float = 10.0, procs_interval_s: float = 1.0, pcie_interval_s: float = 1.0,
                 gpm: bool = True, util_samples: bool = False, nvml: Any = None,
                 interval_s: float | None = None) -> None:
        if interval_s is not None and interval_s > 0:  # the CLI's --nvml-interval
            rate_hz = 1.0 / interval_s
        self.rate_hz = max(0.1, float(rate_hz))
        self.procs_interval_s = procs_interval_s
        self.pcie_interval_s = pcie_interval_s
        self.gpm = gpm
        self.util_samples = util_samples
        self._nvml = nvml  # tests pass tests/fakes/fake_nvml.FakeNvml; None imports pynvml
        self._unsupported: set[tuple[int, str]] = set()
        self.calls = 0
        self.call_s = 0.0  # wall time inside NVML calls (probe cost)

    # -- availability ----------------------------------------------------------------------------
    def _lib(self) -> Any:
        return self._nvml if self._nvml is not None else import_nvml()

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        try:
            nv = self._lib()
        except ImportError:
            return False, "nvidia-ml-py is not installed (pip install 'diagnose[gpu]')"
        try:
            nv.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            return False, f"no NVIDIA driver/NVML here ({e})"
        try:
            n = int(nv.nvmlDeviceGetCount())
        except Exception as e:
            return False, f"NVML cannot count GPUs ({e})"
        finally:
            _shutdown(nv)
        return (True, "") if n > 0 else (False, "NVML found no GPU")

    # -- run --------------------------------------------------------------------------------------
    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        ok, why = self.available(ctx)
        if not ok:
            return ProbeStatus(NAME, "unavailable", why)
        halt = threading.Event()

        async def relay() -> None:
            await ctx.stop.wait()
            halt.set()

        relay_task = asyncio.create_task(relay())
        try:
            return await asyncio.to_thread(self._collect, ctx, halt)
        finally:
            halt.set()
            relay_task.cancel()

    def _call(self, gpu: int, key: str, fn: Any, *args: Any) -> Any:
        """One NVML call; a metric the GPU does not support is remembered and not asked again."""
        if (gpu, key) in self._unsupported:
            return None
        self.calls += 1
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except Exception:
            self._unsupported.add((gpu, key))
            return None
        finally:
            self.call_s += time.perf_counter() - t0

    def _collect(self, ctx: CaptureContext, halt: threading.Event) -> ProbeStatus:
        c0 = time.thread_time()
        nv = self._lib()
        try:
            nv.nvmlInit()
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(int(nv.nvmlDeviceGetCount()))]
        except Exception as e:
            return ProbeStatus(NAME, "failed", f"NVML initialisation failed: {e}")
        stream = ctx.bundle.stream("gpu_samples", "NVML GPU counters")
        try:
            devices = [self._device(nv, i, h) for i, h in enumerate(handles)]
            stream.write_many(devices)
            gpm_prev: dict[int, Any] = {}
            # buffered utilisation: only samples taken after the capture started (the driver keeps ~15 s)
            last_util_ts = dict.fromkeys(range(len(handles)), time.time_ns() // 1000)
            next_procs = next_util = next_pcie = 0.0
            period = 1.0 / self.rate_hz
            ticks = 0
            t_start = time.monotonic()
            while not halt.is_set():
                t0 = time.monotonic()
                pcie = t0 >= next_pcie
                if pcie:
                    next_pcie = t0 + self.pcie_interval_s
                recs: list[Sample | UtilSamples | Procs | None] = [self._sample(ctx, nv, i, h, devices[i], gpm_prev, pcie)
                                                     for i, h in enumerate(handles)]
                if self.util_samples and t0 >= next_util:
                    next_util = t0 + 1.0
                    recs += self._util_samples(ctx, nv, handles, devices, last_util_ts)
                if t0 >= next_procs:
                    next_procs = t0 + self.procs_interval_s
                    recs += [self._procs(ctx, nv, i, h) for i, h in enumerate(handles)]
                stream.write_many([r for r in recs if r])
                ticks += 1
                halt.wait(max(0.0, period - (time.monotonic() - t0)))
            for s in gpm_prev.values():
                self._call(-1, "gpm_free", nv.nvmlGpmSampleFree, s)
        finally:
            _shutdown(nv)
        wall = time.monotonic() - t_start
        unsupported = sorted({k for _, k in self._unsupported})
        own = time.thread_time() - c0
        return ProbeStatus(NAME, "ok", "", {"gpus": len(handles), "ticks": ticks, "rate_hz": self.rate_hz,
                                            "wall_s": round(wall, 3), "nvml_calls": self.calls,
                                            "nvml_call_ms": round(self.call_s * 1e3, 3),
                                            "unsupported": unsupported,
                                            "names": [d["name"] for d in devices],
                                            "cost": cost(0.0, own, wall, True,
                                                         "own: this probe's thread CPU (NVML calls and records); "
                                                         "the driver answers without stopping the engine",
                                                         call_ms_mean=round(self.call_s * 1e3 / max(1, self.calls), 4))})

    def _device(self, nv: Any, i: int, h: Any) -> Device:
        mem = self._call(i, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        limit = self._call(i, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
        gpm_ok = False
        if self.gpm and hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            sup = self._call(i, "gpm_support", nv.nvmlGpmQueryDeviceSupport, h)
            gpm_ok = bool(getattr(sup, "isSupportedDevice", 0))
        name = self._call(i, "name", nv.nvmlDeviceGetName, h)
        return {"kind": "device", "gpu": i, "name": name.decode() if isinstance(name, bytes) else str(name),
                "uuid": str(self._call(i, "uuid", nv.nvmlDeviceGetUUID, h) or ""),
                "mem_total_bytes": int(mem.total) if mem is not None else None,
                "power_limit_w": limit / 1000.0 if limit is not None else None,
                "sm_clock_max_mhz": self._call(i, "sm_clock_max", nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
                "mem_clock_max_mhz": self._call(i, "mem_clock_max", nv.nvmlDeviceGetMaxClockInfo, h,
                                                nv.NVML_CLOCK_MEM),
                "gpm_supported": gpm_ok,
                "util_samples": self.util_samples and hasattr(nv, "nvmlDeviceGetSamples")}

    def _sample(self, ctx: CaptureContext, nv: Any, i: int, h: Any, dev: Device,
                gpm_prev: dict[int, Any], pcie: bool = True) -> Sample:
        r: Sample = {"kind": "sample", "t_ns": ctx.now_ns(), "gpu": i}
        util = self._call(i, "util", nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            r["util_gpu_ratio"] = util.gpu / 100.0
            r["util_mem_ratio"] = util.memory / 100.0
        mem = self._call(i, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            r["mem_used_bytes"], r["mem_total_bytes"] = int(mem.used), int(mem.total)
        for key, clock in (("sm_clock_mhz", nv.NVML_CLOCK_SM), ("mem_clock_mhz", nv.NVML_CLOCK_MEM)):
            v = self._call(i, key, nv.nvmlDeviceGetClockInfo, h, clock)
            if v is not None:
                r[key] = v
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        if fn is not None and (v := self._call(i, "throttle", fn, h)) is not None:
            r["throttle_reasons"] = int(v)
        if (v := self._call(i, "power", nv.nvmlDeviceGetPowerUsage, h)) is not None:
            r["power_w"] = v / 1000.0
        if dev.get("power_limit_w") is not None:
            r["power_limit_w"] = dev["power_limit_w"]
        if (v := self._call(i, "temp", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)) is not None:
            r["temp_c"] = v
        for key, counter in (("pcie_tx_bytes_s", nv.NVML_PCIE_UTIL_TX_BYTES),
                             ("pcie_rx_bytes_s", nv.NVML_PCIE_UTIL_RX_BYTES)):
            if pcie and (v := self._call(i, key, nv.nvmlDeviceGetPcieThroughput, h, counter)) is not None:
                r[key] = v * 1024  # NVML reports KB/s
        r.update(self._nvlink(nv, i, h))
        if dev.get("gpm_supported"):
            r.update(self._gpm(nv, i, h, gpm_prev))
        return r

    def _nvlink(self, nv: Any, i: int, h: Any) -> dict[str, int]:
        ids = (getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None),
               getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None))
        if None in ids or not hasattr(nv, "nvmlDeviceGetFieldValues"):
            return {}
        vals = self._call(i, "nvlink", nv.nvmlDeviceGetFieldValues, h, list(ids))
        if not vals:
            return {}
        out = {}
        for key, fv in zip(("nvlink_tx_bytes", "nvlink_rx_bytes"), vals, strict=False):
            if getattr(fv, "nvmlReturn", 1) == 0:
                out[key] = int(fv.value.ullVal) * 1024  # cumulative KiB
        return out

    def _gpm(self, nv: Any, i: int, h: Any, prev: dict[int, Any]) -> dict[str, float]:
        cur = self._call(i, "gpm_alloc", nv.nvmlGpmSampleAlloc)
        if cur is None:
            return {}
        if self._call(i, "gpm_get", nv.nvmlGpmSampleGet, h, cur) is None:
            self._call(-1, "gpm_free", nv.nvmlGpmSampleFree, cur)
            return {}
        old = prev.get(i)
        prev[i] = cur
        if old is None:
            return {}
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", 1)
        mg.numMetrics = len(GPM_METRICS)
        mg.sample1, mg.sample2 = old, cur
        for k, mid in enumerate(GPM_METRICS.values()):
            mg.metrics[k].metricId = mid
        got = self._call(i, "gpm_metrics", nv.nvmlGpmMetricsGet, mg)
        self._call(i, "gpm_free", nv.nvmlGpmSampleFree, old)
        if got is None:
            return {}
        vals = {key: float(got.metrics[k].value) / 100.0 for k, key in enumerate(GPM_METRICS)}
        return {k: v for k, v in vals.items() if math.isfinite(v)}  # NaN: no reading (left out, not zero)

    def _util_samples(self, ctx: CaptureContext, nv: Any, handles: list[Any], devices: list[Device],
                      last: dict[int, int]) -> list[UtilSamples]:
        out: list[UtilSamples] = []
        if not hasattr(nv, "nvmlDeviceGetSamples"):
            return out
        offset_ns = time.time_ns() - ctx.now_ns()  # NVML stamps these with wall-clock microseconds
        for i, h in enumerate(handles):
            got = self._call(i, "util_samples", nv.nvmlDeviceGetSamples, h, nv.NVML_GPU_UTILIZATION_SAMPLES,
                             last[i])
            if not got:
                continue
            _, samples = got
            pts = [(int(s.timeStamp), _sample_value(s)) for s in samples if int(s.timeStamp) > last[i]]
            if not pts:
                continue
            last[i] = max(t for t, _ in pts)
            out.append({"kind": "util", "gpu": i, "t_ns": [t * 1000 - offset_ns for t, _ in pts],
                        "util_gpu_ratio": [v / 100.0 for _, v in pts]})
        return out

    def _procs(self, ctx: CaptureContext, nv: Any, i: int, h: Any) -> Procs | None:
        got = self._call(i, "procs", nv.nvmlDeviceGetComputeRunningProcesses, h)
        if got is None:
            return None
        return {"kind": "procs", "t_ns": ctx.now_ns(), "gpu": i,
                "procs": [{"pid": int(p.pid), "used_bytes": int(p.usedGpuMemory or 0)} for p in got]}


def _sample_value(s: Any) -> float:
    v = s.sampleValue  # a c_nvmlValue_t union; utilisation samples are unsigned ints
    return float(v.uiVal) if hasattr(v, "uiVal") else float(v)


def _shutdown(nv: Any) -> None:
    try:
        nv.nvmlShutdown()
    except Exception:
        pass


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


# -- attach options -------------------------------------------------------------------------------------
def _build(o: Options, setup: ProbeSetup) -> NvmlProbe:
    return NvmlProbe(interval_s=parse_duration(o["nvml_interval"]))


SPEC = ProbeSpec(
    name=NAME, title="GPU counters (NVML)",
    enabled=lambda o: bool(o["nvml"]), build=_build,
    options=(
        ProbeOption("--nvml/--no-nvml", flag=True, default=True, show_default=True,
                    help="Sample GPU counters (unavailable without a driver)."),
        ProbeOption("--nvml-interval", default="100ms", show_default=True),
    ),
)
