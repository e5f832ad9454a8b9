"""Host stalls inside engine steps (issue 35 item 5): per counted step, the longest stretch in which the GPU ran
nothing while the CPU had not yet called the launch of the next kernel, where the CPU was then (the innermost
CPU frame open when the stall began) and whether the trace recorded any CPU op inside it. None recorded means
untraced time: native code below Python, or a wait for the GIL; the probe that sees it samples native stacks
(py-spy ``--native``, nsys / rocprof CPU sampling), not a longer Kineto trace.

A stall is a *host* stall only for the part before the launch call of the kernel that ends the GPU gap: a
kernel launched before the gap began that still started late waited for something else (a stream, an event, a
peer), not for the CPU.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnose.trace.timeline import union

STALL_COLUMNS = ["rank", "step", "step_type", "graph_replays", "stall_us", "offset_us", "frame", "cpu_ops_inside",
                 "untraced"]
STALL_STEP_MIN_SHARE = 0.1  # a step's stall counts when it is at least this share of the step's CPU duration


def _events(*frames: pd.DataFrame | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(names, starts, ends) of the CPU-side events of the given tables, together."""
    parts = [f for f in frames if f is not None and len(f)]
    if not parts:
        return np.zeros(0, dtype=object), np.zeros(0), np.zeros(0)
    names = np.concatenate([f["name"].astype(str).to_numpy(dtype=object) for f in parts])
    ts = np.concatenate([f["ts_us"].to_numpy(dtype=float) for f in parts])
    te = ts + np.concatenate([f["dur_us"].to_numpy(dtype=float) for f in parts])
    return names, ts, te


def host_stalls(steps: pd.DataFrame, gpu: pd.DataFrame, launch_ts: np.ndarray, runtime: pd.DataFrame,
                cpu_frames: list[pd.DataFrame | None], pre_trace: tuple[np.ndarray, np.ndarray] | None = None,
                ) -> pd.DataFrame:
    """One row per counted step that launched kernels: its longest host stall (``stall_us``, from the GPU going
    idle to the launch call of the kernel that ended the idle), where it began (``offset_us`` from the step
    start), the innermost CPU frame open then (``frame``: annotations, CPU ops, the kept Python frames), and how
    many CPU ops and runtime calls (any thread) began inside it (``cpu_ops_inside``; 0 = ``untraced``). Linear in
    the events: kernels are assigned to steps by a sorted search, and each step's frame is sought among the CPU
    events that began inside it."""
    if steps.empty or gpu.empty or "excluded" not in steps:
        return pd.DataFrame(columns=STALL_COLUMNS)
    st_all = steps[steps["excluded"].fillna("").astype(str) == ""]
    gs = gpu["ts_us"].to_numpy(dtype=float)
    ge = gs + gpu["dur_us"].to_numpy(dtype=float)
    ps, pe = pre_trace if pre_trace is not None else (np.zeros(0), np.zeros(0))
    bs, be = union(np.concatenate([gs, ps]), np.concatenate([ge, pe]))  # the GPU running anything
    names, cs, ce = _events(*cpu_frames)
    by_start = np.argsort(cs, kind="stable")
    names, cs, ce = names[by_start], cs[by_start], ce[by_start]
    _, os_, _ = _events(*cpu_frames[1:], runtime)  # CPU ops and runtime calls (not the enclosing frames)
    os_ = np.sort(os_)
    st = st_all["ts_us"].to_numpy(dtype=float)
    en = st + st_all["dur_us"].to_numpy(dtype=float)
    order = np.argsort(st, kind="stable")
    st, en = st[order], en[order]
    # each kernel's step (the step whose CPU interval holds its launch call), as step_gpu_use assigns them
    k = np.searchsorted(st, launch_ts, side="right") - 1
    ok = np.isfinite(launch_ts) & (k >= 0)
    ok[ok] &= launch_ts[ok] <= en[k[ok]]
    idx = np.flatnonzero(ok)
    if not len(idx):
        return pd.DataFrame(columns=STALL_COLUMNS)
    kk = k[idx]
    # the GPU idle just before each kernel (from the end of the last busy stretch that began before it, or the
    # step start), its host part only: up to the kernel's launch call
    j = np.searchsorted(bs, gs[idx], side="left") - 1
    idle_from = np.maximum(st[kk], np.where(j >= 0, be[np.maximum(j, 0)], -np.inf))
    host = np.minimum(launch_ts[idx], gs[idx]) - idle_from
    best = pd.DataFrame({"step": kk, "host": host, "t0": idle_from}).sort_values(
        ["step", "host"], ascending=[True, False], kind="stable").drop_duplicates("step")
    best = best[best["host"] > 0]
    rows = []
    info = st_all.iloc[order].reset_index(drop=True)
    for step_i, stall, t0 in zip(best["step"].to_numpy(), best["host"].to_numpy(dtype=float),
                                 best["t0"].to_numpy(dtype=float), strict=True):
        s = info.iloc[int(step_i)]
        # the innermost frame open at t0: of the events that began in the step up to t0, the last still open
        lo = int(np.searchsorted(cs, float(s["ts_us"]), side="left"))
        hi = int(np.searchsorted(cs, t0, side="right"))
        still = np.flatnonzero(ce[lo:hi] > t0)
        frame = str(names[lo + still[-1]]) if len(still) else ""
        inside = int(np.searchsorted(os_, t0 + stall, side="left") - np.searchsorted(os_, t0, side="right"))
        rows.append({"rank": int(s["rank"]), "step": int(s["step"]), "step_type": str(s["step_type"]),
                     "graph_replays": float(s.get("graph_replays", np.nan)), "stall_us": stall,
                     "offset_us": t0 - float(s["ts_us"]), "frame": frame[:200], "cpu_ops_inside": inside,
                     "untraced": inside == 0})
    return pd.DataFrame(rows, columns=STALL_COLUMNS)
