"""GPU evidence (stream ``gpu_samples`` from probes/nvml.py) -> tables and signals (report sections:
reports/sections/gpu.py).

Tables (t_s = seconds since the clock anchor):

* ``gpu_devices``: ``gpu, name, mem_total_bytes, power_limit_w, sm_clock_max_mhz, gpm_supported``.
* ``gpu_samples``: ``t_s, gpu, util_gpu_ratio, util_mem_ratio, mem_used_ratio, sm_clock_mhz, mem_clock_mhz,
  throttle_reasons, throttle_active, power_w, power_limit_w, temp_c, pcie_tx_mb_s, pcie_rx_mb_s,
  nvlink_tx_mb_s, nvlink_rx_mb_s, dram_bw_util_ratio, sm_util_ratio, sm_occupancy_ratio, tensor_util_ratio``
  (NaN where the GPU did not report a value).
* ``gpu_util``: driver-buffered utilisation samples ``t_s, gpu, util_gpu_ratio`` (nvmlDeviceGetSamples).
* ``gpu_processes``: ``t_s, gpu, pid, used_mb``.

``util_gpu_ratio`` is NVML's utilization.gpu: the fraction of time at least one kernel was running. A GPU
can show 100% while most SMs idle; GPM's ``sm_util_ratio`` and ``dram_bw_util_ratio`` say how full it was.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from diagnose.analysis import Window
from diagnose.io.bundle import Bundle
from diagnose.model import Signal, Source
from diagnose.normalize import TableContext, sampled_in

SOURCE: Source = "gpu"
BENIGN_THROTTLE_MASK = 0x1 | 0x2 | 0x100  # idle, application clocks, display clock: not a slowdown
BUSY_UTIL_MIN = 0.05  # samples below this utilisation are idle (clocks drop by design when idle)
_SAMPLE_KEYS = ("util_gpu_ratio", "util_mem_ratio", "sm_clock_mhz", "mem_clock_mhz", "power_w", "power_limit_w",
                "temp_c", "dram_bw_util_ratio", "sm_util_ratio", "sm_occupancy_ratio", "tensor_util_ratio")
_COLS = {
    "gpu_devices": ["gpu", "name", "mem_total_bytes", "power_limit_w", "sm_clock_max_mhz", "gpm_supported"],
    "gpu_samples": ["t_s", "gpu", *_SAMPLE_KEYS, "mem_used_ratio", "throttle_reasons", "throttle_active",
                    "pcie_tx_mb_s", "pcie_rx_mb_s", "nvlink_tx_mb_s", "nvlink_rx_mb_s"],
    "gpu_util": ["t_s", "gpu", "util_gpu_ratio"],
    "gpu_processes": ["t_s", "gpu", "pid", "used_mb"],
}


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def tables(bundle: Bundle, ctx: TableContext | None = None) -> dict[str, pd.DataFrame]:
    data: dict[str, list[dict[str, Any]]] = {k: [] for k in _COLS}
    if not bundle.has_stream("gpu_samples"):
        return {k: pd.DataFrame(columns=v) for k, v in _COLS.items()}
    anchor = bundle.anchor_mono_ns
    nvlink_prev: dict[int, tuple[float, float, float]] = {}
    for r in bundle.iter_records("gpu_samples"):
        kind = r.get("kind")
        if kind == "device":
            data["gpu_devices"].append({k: r.get(k) for k in _COLS["gpu_devices"]})
        elif kind == "sample" and isinstance(r.get("t_ns"), int):
            t_s = (r["t_ns"] - anchor) / 1e9
            row: dict[str, Any] = {"t_s": t_s, "gpu": int(r.get("gpu", 0))}
            row.update({k: _num(r.get(k)) for k in _SAMPLE_KEYS})
            used, total = _num(r.get("mem_used_bytes")), _num(r.get("mem_total_bytes"))
            row["mem_used_ratio"] = used / total if total > 0 else math.nan
            mask = r.get("throttle_reasons")
            row["throttle_reasons"] = int(mask) if isinstance(mask, int) else -1
            row["throttle_active"] = bool(isinstance(mask, int) and mask & ~BENIGN_THROTTLE_MASK)
            row["pcie_tx_mb_s"] = _num(r.get("pcie_tx_bytes_s")) / 1e6
            row["pcie_rx_mb_s"] = _num(r.get("pcie_rx_bytes_s")) / 1e6
            row["nvlink_tx_mb_s"] = row["nvlink_rx_mb_s"] = math.nan
            tx, rx = _num(r.get("nvlink_tx_bytes")), _num(r.get("nvlink_rx_bytes"))
            prev = nvlink_prev.get(row["gpu"])
            if prev is not None and t_s > prev[0] and not math.isnan(tx):
                row["nvlink_tx_mb_s"] = max(0.0, tx - prev[1]) / (t_s - prev[0]) / 1e6
                row["nvlink_rx_mb_s"] = max(0.0, rx - prev[2]) / (t_s - prev[0]) / 1e6
            if not math.isnan(tx):
                nvlink_prev[row["gpu"]] = (t_s, tx, rx)
            data["gpu_samples"].append(row)
        elif kind == "util":
            ts, vs = r.get("t_ns") or [], r.get("util_gpu_ratio") or []
            data["gpu_util"] += [{"t_s": (t - anchor) / 1e9, "gpu": int(r.get("gpu", 0)), "util_gpu_ratio": _num(v)}
                                 for t, v in zip(ts, vs, strict=False) if isinstance(t, int)]
        elif kind == "procs" and isinstance(r.get("t_ns"), int):
            data["gpu_processes"] += [{"t_s": (r["t_ns"] - anchor) / 1e9, "gpu": int(r.get("gpu", 0)),
                                       "pid": p.get("pid"), "used_mb": _num(p.get("used_bytes")) / 2**20}
                                      for p in r.get("procs") or [] if isinstance(p, dict)]
    return {k: pd.DataFrame(v, columns=_COLS[k]) for k, v in data.items()}


def _mean_series(df: pd.DataFrame, col: str) -> tuple[tuple[float, float], ...]:
    s = df.dropna(subset=[col]).groupby("t_s")[col].mean()
    return tuple((float(k), float(v)) for k, v in s.items())


def signals(t: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    df = sampled_in(t.get("gpu_samples", pd.DataFrame(columns=_COLS["gpu_samples"])), window)
    if df.empty:
        return []
    out: list[Signal] = []

    def add(name: str, value: float, unit: str, desc: str, series: tuple[tuple[float, float], ...] = ()) -> None:
        if value is not None and math.isfinite(value):
            out.append(Signal(name, float(value), unit, SOURCE, desc, series))

    util = df["util_gpu_ratio"].dropna()
    if not util.empty:
        per_gpu = df.groupby("gpu")["util_gpu_ratio"].mean()
        add("gpu_util_mean_ratio", float(util.mean()), "ratio",
            "NVML utilization.gpu (time fraction with a kernel running), mean over GPUs and samples",
            _mean_series(df, "util_gpu_ratio"))
        add("gpu_util_min_ratio", float(per_gpu.min()), "ratio",
            "NVML utilization.gpu time fraction of the least busy GPU (mean over the window)")
        add("gpu_idle_sample_ratio", float((util < BUSY_UTIL_MIN).mean()), "ratio",
            f"share of samples with utilization.gpu below {BUSY_UTIL_MIN:.0%}")
    for col, name, desc in (
        ("dram_bw_util_ratio", "gpu_mem_bw_util_mean_ratio", "GPM DRAM bandwidth utilisation, mean"),
        ("sm_util_ratio", "gpu_sm_util_mean_ratio", "GPM SM utilisation (share of SMs busy), mean"),
        ("sm_occupancy_ratio", "gpu_sm_occupancy_mean_ratio", "GPM SM occupancy (warps resident), mean"),
        ("tensor_util_ratio", "gpu_tensor_util_mean_ratio", "GPM tensor-core utilisation, mean"),
        ("util_mem_ratio", "gpu_mem_busy_mean_ratio", "NVML utilization.memory (time fraction memory was "
                                                      "read or written), mean"),
        ("temp_c", "gpu_temp_max_c", "GPU temperature, max (C)"),
    ):
        v = df[col].dropna()
        if not v.empty:
            add(name, float(v.max() if name.endswith("max_c") else v.mean()),
                "C" if name.endswith("_c") else "ratio", desc, _mean_series(df, col))
    th = df[df["throttle_reasons"] >= 0]
    if not th.empty:
        add("gpu_throttle_active_ratio", float(th["throttle_active"].mean()), "ratio",
            "share of samples with a slowdown clock-event reason (power cap, thermal, HW slowdown)",
            tuple((float(k), float(v)) for k, v in th.groupby("t_s")["throttle_active"].max().items()))
    mem = df["mem_used_ratio"].dropna()
    if not mem.empty:
        add("gpu_mem_used_max_ratio", float(mem.max()), "ratio", "GPU memory used / total, max")
    pw = df.dropna(subset=["power_w", "power_limit_w"])
    pw = pw[pw["power_limit_w"] > 0]
    if not pw.empty:
        add("gpu_power_over_limit_ratio", float((pw["power_w"] / pw["power_limit_w"]).max()), "ratio",
            "power draw / enforced power limit, max")
    add_clock_drop(t, df, add)
    for col, name in (("pcie_tx_mb_s", "gpu_pcie_tx_mean_mb_s"), ("pcie_rx_mb_s", "gpu_pcie_rx_mean_mb_s"),
                      ("nvlink_tx_mb_s", "gpu_nvlink_tx_mean_mb_s")):
        v = df[col].dropna()
        if not v.empty:
            add(name, float(v.mean()), "MB/s", f"{col.split('_')[0].upper()} throughput, mean (MB/s)")
    return out


def add_clock_drop(t: dict[str, pd.DataFrame], df: pd.DataFrame, add: Any) -> None:
    """1 - min busy SM clock / max SM clock (the device maximum when known, else the observed maximum)."""
    busy = df[(df["util_gpu_ratio"].fillna(1.0) >= BUSY_UTIL_MIN)].dropna(subset=["sm_clock_mhz"])
    if busy.empty:
        return
    dev = t.get("gpu_devices", pd.DataFrame(columns=_COLS["gpu_devices"]))
    drops = []
    for gpu, g in busy.groupby("gpu"):
        mx = pd.to_numeric(dev[dev["gpu"] == gpu]["sm_clock_max_mhz"], errors="coerce").max() if not dev.empty \
            else np.nan
        ref = float(mx) if mx and math.isfinite(mx) else float(g["sm_clock_mhz"].max())
        if ref > 0:
            drops.append(1.0 - float(g["sm_clock_mhz"].min()) / ref)
    if drops:
        add("gpu_sm_clock_drop_ratio", max(0.0, max(drops)), "ratio",
            "1 - lowest SM clock while busy / maximum SM clock")
