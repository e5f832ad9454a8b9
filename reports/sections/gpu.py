"""GPU sections: one row per GPU (NVML and GPM) and utilisation / clocks over time."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from .model import Cell, LineChart, LineSeries, Quantity, Section, Table

Tables = Mapping[str, pd.DataFrame]


def sections(t: Tables) -> list[Section]:
    df = t.get("gpu_samples")
    if df is None or df.empty:
        return []
    dev = t.get("gpu_devices")
    names = dict(zip(dev["gpu"], dev["name"], strict=False)) if dev is not None and not dev.empty else {}
    rows: list[tuple[Cell, ...]] = []
    for gpu, g in df.groupby("gpu"):
        def m(col: str, unit: str = "%", scale: float = 100.0, agg: str = "mean", g: pd.DataFrame = g) -> Quantity:
            v = g[col].dropna()
            return Quantity(float(getattr(v, agg)()) * scale if not v.empty else None, unit, 1)
        throttled = g.loc[g["throttle_reasons"] >= 0, "throttle_active"]
        rows.append((int(gpu), str(names.get(gpu, "")), m("util_gpu_ratio"), m("sm_util_ratio"), m("dram_bw_util_ratio"),
                     m("tensor_util_ratio"), m("mem_used_ratio", agg="max"), m("sm_clock_mhz", "MHz", 1, "min"),
                     m("power_w", "W", 1, "max"), m("temp_c", "C", 1, "max"),
                     Quantity(100 * float(throttled.mean()) if len(throttled) else None, "%", 1)))
    table = Section("gpu_summary", "GPUs (NVML)", Table(
        ("gpu", "name", "util.gpu % (time)", "SM util %", "DRAM BW %", "tensor %", "mem used % max",
         "SM clock min MHz", "power max W", "temp max C", "throttled % of samples"), tuple(rows),
        "util.gpu is the share of time at least one kernel ran (a time fraction, not how busy the SMs were); SM "
        "util, DRAM BW and tensor come from GPM and are empty where the GPU lacks GPM."), group="gpu", order=50)

    def pts(g: pd.DataFrame, col: str, scale: float, digits: int | None) -> tuple[tuple[float, float], ...]:
        return tuple((round(float(a), 3), round(scale * float(b), digits) if digits is not None else float(b))
                     for a, b in zip(g["t_s"], g[col], strict=False) if math.isfinite(b))

    groups = list(df.groupby("gpu"))
    series = [LineSeries(f"GPU {gpu} util.gpu %", pts(g, "util_gpu_ratio", 100, 1)) for gpu, g in groups]
    series += [LineSeries(f"GPU {gpu} DRAM BW %", pts(g, "dram_bw_util_ratio", 100, 1)) for gpu, g in groups
               if g["dram_bw_util_ratio"].notna().any()]
    series += [LineSeries(f"GPU {gpu} SM clock MHz", pts(g, "sm_clock_mhz", 1, None), "right") for gpu, g in groups]
    chart = Section("gpu_timeline", "GPU utilisation and clocks over time", LineChart(
        tuple(series), x_label="time (s)", y_label="%", y2_label="MHz"), group="gpu", order=51)
    return [table, chart]
