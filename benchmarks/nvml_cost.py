#!/usr/bin/env python3
"""What the NVML probe costs on a real GPU, and whether nvmlDeviceGetSamples beats polling utilisation.

Run on a machine with an NVIDIA driver (the lent GPU machine; see benchmarks/gpu_device_check.sh):

    python benchmarks/nvml_cost.py --seconds 8 --out benchmarks/results/nvml_cost.md

1. Latency of each NVML call the probe makes, median and P99 of ``--calls`` calls (microseconds).
2. The probe itself, run alone in this process at 10 Hz (its default) and at 100 Hz, for ``--seconds`` each:
   the process CPU time it used (cores), its ticks and NVML calls per tick.
3. Utilisation two ways over the same 1 s: polling nvmlDeviceGetUtilizationRates at 10 Hz (10 calls)
   against one nvmlDeviceGetSamples call, which returns the driver's own buffered samples: their number
   and cost.

``--fake`` runs the same code against tests/fakes/fake_nvml.py (a FAKE NVML, for checking this script on
a machine without a GPU; its figures mean nothing and are labelled so).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from diagnose.io.writer import BundleWriter  # noqa: E402
from diagnose.probes.base import CaptureContext, Target  # noqa: E402
from diagnose.probes.nvml import NvmlProbe, import_nvml  # noqa: E402


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def call_latencies(nv: Any, h: Any, n: int) -> list[dict[str, Any]]:
    calls: list[tuple[str, Any]] = [
        ("nvmlDeviceGetUtilizationRates", lambda: nv.nvmlDeviceGetUtilizationRates(h)),
        ("nvmlDeviceGetMemoryInfo", lambda: nv.nvmlDeviceGetMemoryInfo(h)),
        ("nvmlDeviceGetClockInfo(SM)", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        ("nvmlDeviceGetClockInfo(MEM)", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
        ("nvmlDeviceGetCurrentClocksEventReasons", lambda: (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons)(h)),
        ("nvmlDeviceGetPowerUsage", lambda: nv.nvmlDeviceGetPowerUsage(h)),
        ("nvmlDeviceGetTemperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        ("nvmlDeviceGetPcieThroughput(TX)", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES)),
        ("nvmlDeviceGetPcieThroughput(RX)", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES)),
        ("nvmlDeviceGetSamples(GPU_UTILIZATION)", lambda: nv.nvmlDeviceGetSamples(
            h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)),
        ("nvmlDeviceGetComputeRunningProcesses", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)),
    ]
    if hasattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"):
        calls.append(("nvmlDeviceGetFieldValues(NVLINK TX,RX)", lambda: nv.nvmlDeviceGetFieldValues(
            h, [nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX])))
    if hasattr(nv, "nvmlGpmSampleAlloc"):
        def gpm_get() -> None:
            s = nv.nvmlGpmSampleAlloc()
            try:
                nv.nvmlGpmSampleGet(h, s)
            finally:
                nv.nvmlGpmSampleFree(s)
        calls.append(("nvmlGpmSampleAlloc+Get+Free", gpm_get))
    out = []
    for name, fn in calls:
        ts: list[float] = []
        err = ""
        for _ in range(n):
            t0 = time.perf_counter_ns()
            try:
                fn()
            except Exception as e:  # an unsupported call: record why, once
                err = f"{type(e).__name__}: {e}"
                break
            ts.append((time.perf_counter_ns() - t0) / 1000.0)
        if ts:
            ts.sort()
            out.append({"call": name, "n": len(ts), "median_us": statistics.median(ts),
                        "p99_us": ts[min(len(ts) - 1, int(0.99 * len(ts)))]})
        else:
            out.append({"call": name, "n": 0, "error": err})
    return out


def run_probe(rate_hz: float, seconds: float, nvml: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        bw = BundleWriter(Path(d) / "b")
        ctx = CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:9"), stop=asyncio.Event())
        probe = NvmlProbe(rate_hz=rate_hz, nvml=nvml)

        async def go() -> Any:
            async def stop() -> None:
                await asyncio.sleep(seconds)
                ctx.stop.set()
            c0, w0 = cpu_s(), time.monotonic()
            st, _ = await asyncio.gather(probe.run(ctx), stop())
            return st, cpu_s() - c0, time.monotonic() - w0

        status, cpu, wall = asyncio.run(go())
        bw.finish()
    d = status.detail or {}
    ticks = max(1, int(d.get("ticks", 0)))
    return {"rate_hz": rate_hz, "state": status.state, "reason": status.reason, "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 3), "cores": round(cpu / wall, 4), "ticks": d.get("ticks"),
            "achieved_hz": round(ticks / wall, 2), "calls_per_tick": round(int(d.get("nvml_calls", 0)) / ticks, 1),
            "cpu_us_per_tick": round(cpu / ticks * 1e6, 1), "unsupported": d.get("unsupported"),
            "gpus": d.get("names")}


def util_two_ways(nv: Any, h: Any) -> dict[str, Any]:
    last = time.time_ns() // 1000 - 1_000_000
    time.sleep(1.0)
    t0 = time.perf_counter_ns()
    _, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, last)
    one_call_us = (time.perf_counter_ns() - t0) / 1000.0
    stamps = sorted(int(s.timeStamp) for s in samples if int(s.timeStamp) > last)
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    poll = []
    for _ in range(10):
        t = time.perf_counter_ns()
        nv.nvmlDeviceGetUtilizationRates(h)
        poll.append((time.perf_counter_ns() - t) / 1000.0)
    return {"get_samples_call_us": round(one_call_us, 1), "samples_in_last_1s": len(stamps),
            "sample_period_ms_median": round(statistics.median(gaps) / 1000.0, 2) if gaps else None,
            "poll_10_calls_us": round(sum(poll), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fake", action="store_true", help="FAKE NVML (tests/fakes), to check the script only")
    a = ap.parse_args()
    if a.fake:
        from tests.fakes.fake_nvml import scenario
        nv: Any = scenario("busy")
        label = "FAKE NVML (dry run: figures mean nothing)"
    else:
        nv = import_nvml()
        label = "real NVML"
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    name = nv.nvmlDeviceGetName(h)
    name = name.decode() if isinstance(name, bytes) else str(name)
    driver = ""
    if hasattr(nv, "nvmlSystemGetDriverVersion"):
        dv = nv.nvmlSystemGetDriverVersion()
        driver = dv.decode() if isinstance(dv, bytes) else str(dv)
    lat = call_latencies(nv, h, a.calls)
    util = util_two_ways(nv, h) if not a.fake else {}
    nv.nvmlShutdown()
    runs = [run_probe(r, a.seconds, None if not a.fake else scenario("busy")) for r in (10.0, 100.0)]
    result = {"label": label, "gpu": name, "driver": driver, "calls": lat, "util_two_ways": util, "probe": runs}
    lines = [f"# NVML probe cost ({label})", "", f"GPU: {name}; driver {driver}", "",
             "`python benchmarks/nvml_cost.py " + " ".join(sys.argv[1:]) + "`", "",
             "## Per call (microseconds)", "", "| call | n | median | P99 |", "|---|---|---|---|"]
    for c in lat:
        if c["n"]:
            lines.append(f"| {c['call']} | {c['n']} | {c['median_us']:.1f} | {c['p99_us']:.1f} |")
        else:
            lines.append(f"| {c['call']} | 0 | unsupported: {c['error']} | |")
    lines += ["", "## The probe alone in this process", "",
              "| rate | wall s | ticks | achieved Hz | NVML calls/tick | CPU us/tick | cores |",
              "|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['rate_hz']:g} Hz | {r['wall_s']} | {r['ticks']} | {r['achieved_hz']} | "
                     f"{r['calls_per_tick']} | {r['cpu_us_per_tick']} | {r['cores']} |")
    lines += ["", f"Unsupported on this GPU: {runs[0]['unsupported']}"]
    if util:
        lines += ["", "## Utilisation: driver-buffered samples vs polling", "",
                  f"- one nvmlDeviceGetSamples call: {util['get_samples_call_us']} us, returning "
                  f"{util['samples_in_last_1s']} samples of the last second (median spacing "
                  f"{util['sample_period_ms_median']} ms)",
                  f"- polling nvmlDeviceGetUtilizationRates 10 times (10 Hz for 1 s): {util['poll_10_calls_us']} us"]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text, encoding="utf-8")
        a.out.with_suffix(".json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
