"""GPU time per rank and stream, and the attribution of idle gaps (interval arithmetic in numpy)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

LAUNCH_GAP_US = 30.0  # a gap shorter than this between back-to-back launched kernels is launch overhead


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals; returns sorted, disjoint (starts, ends)."""
    if len(starts) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = np.maximum.accumulate(ends[order])
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    ms = s[idx]
    me = e[np.r_[idx[1:] - 1, len(s) - 1]]
    return ms, me


def union_len(starts: np.ndarray, ends: np.ndarray) -> float:
    ms, me = union(starts, ends)
    return float((me - ms).sum())


def overlap_len(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two interval sets."""
    la = union_len(*a)
    lb = union_len(*b)
    lab = union_len(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
    return la + lb - lab


def clipped_union_len(ms: np.ndarray, me: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each window [lo, hi], the length of the merged intervals (ms, me) inside it."""
    if len(ms) == 0 or len(lo) == 0:
        return np.zeros(len(lo))
    cum = np.concatenate([[0.0], np.cumsum(me - ms)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(ms, t, side="right")  # intervals starting at or before t
        full = cum[np.maximum(k - 1, 0)]
        partial = np.where(k > 0, np.clip(t - ms[np.maximum(k - 1, 0)], 0, me[np.maximum(k - 1, 0)]
                                          - ms[np.maximum(k - 1, 0)]), 0.0)
        return np.where(k > 0, full + partial, 0.0)

    return covered_before(hi) - covered_before(lo)


def gpu_time(gpu: pd.DataFrame, cls: pd.Series, rank: int) -> tuple[dict[str, Any], pd.DataFrame]:
    """Busy/idle/compute/comm/memory for one rank (all streams) and busy/idle per stream."""
    s = gpu["ts_us"].to_numpy()
    e = s + gpu["dur_us"].to_numpy()
    c = cls.to_numpy()
    comm_m = c == "communication"
    mem_m = c == "memory"
    comp_m = ~(comm_m | mem_m)
    window = float(e.max() - s.min())
    busy = union_len(s, e)
    comp = union_len(s[comp_m], e[comp_m])
    comm = union_len(s[comm_m], e[comm_m])
    comp_or_comm = union_len(s[comp_m | comm_m], e[comp_m | comm_m])
    comm_exposed = comp_or_comm - comp
    mem_exposed = busy - comp_or_comm
    overlap = comp + comm - comp_or_comm
    row: dict[str, Any] = {
        "rank": rank, "window_us": window, "busy_us": busy, "idle_us": window - busy,
        "compute_us": comp, "comm_exposed_us": comm_exposed, "memory_exposed_us": mem_exposed,
        "comm_total_us": comm, "comm_overlapped_us": overlap,
        "busy_ratio": busy / window if window > 0 else np.nan,
        "idle_ratio": (window - busy) / window if window > 0 else np.nan,
        "compute_ratio": comp / window if window > 0 else np.nan,
        "comm_ratio": comm_exposed / window if window > 0 else np.nan,
        "memory_ratio": mem_exposed / window if window > 0 else np.nan,
        "comm_overlap_ratio": overlap / comm if comm > 0 else np.nan,
        "kernels": int((c != "memory").sum()), "streams": int(gpu["stream"].nunique()),
    }
    rows = []
    for stream, idx in gpu.groupby("stream", sort=True, observed=True).indices.items():
        ss, ee = s[idx], e[idx]
        w = float(ee.max() - ss.min())
        b = union_len(ss, ee)
        rows.append({"rank": rank, "stream": int(stream), "events": len(idx), "window_us": w, "busy_us": b,
                     "idle_us": w - b, "busy_ratio": b / w if w > 0 else np.nan})
    return row, pd.DataFrame(rows)


def launch_start_for(gpu: pd.DataFrame, runtime: pd.DataFrame) -> np.ndarray:
    """Start time of the runtime call that launched each GPU event (NaN when none matches)."""
    out = np.full(len(gpu), np.nan)
    rt = runtime[runtime["corr"] >= 0]
    if rt.empty or gpu.empty:
        return out
    rc = rt["corr"].to_numpy()
    order = np.argsort(rc, kind="stable")
    rc = rc[order]
    rts = rt["ts_us"].to_numpy()[order]
    gc = gpu["corr"].to_numpy()
    k = np.searchsorted(rc, gc)
    k = np.minimum(k, len(rc) - 1)
    hit = (rc[k] == gc) & (gc >= 0)
    out[hit] = rts[k[hit]]
    return out


def idle_attribution(gpu: pd.DataFrame, launch_ts: np.ndarray, rank: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Classify idle gaps per stream (HTA's rule) and for the whole GPU (gaps in the all-stream union).

    A gap before a GPU event is *host_wait* when the runtime call that launched the event started after the
    previous event ended (the CPU was late); otherwise *launch_overhead* when the gap is under 30 µs
    (back-to-back kernels); otherwise *other* (cross-stream waits, syncs, unmatched launches).
    """
    s = gpu["ts_us"].to_numpy()
    e = s + gpu["dur_us"].to_numpy()
    rows = []
    for stream, idx in gpu.groupby("stream", sort=True, observed=True).indices.items():
        order = idx[np.argsort(s[idx], kind="stable")]
        ss, ee, ll = s[order], e[order], launch_ts[order]
        prev_end = np.maximum.accumulate(ee)[:-1]
        gap = ss[1:] - prev_end
        rows.append({"rank": rank, "stream": int(stream), **_split_gaps(gap, ll[1:], prev_end)})
    per_stream = pd.DataFrame(rows)
    # whole GPU: gaps in the union of all streams, attributed to the event that ends each gap
    order = np.argsort(s, kind="stable")
    ss, ee, ll = s[order], e[order], launch_ts[order]
    prev_end = np.maximum.accumulate(ee)[:-1]
    gap = ss[1:] - prev_end
    whole = _split_gaps(gap, ll[1:], prev_end)
    return per_stream, {"rank": rank, **whole}


def _split_gaps(gap: np.ndarray, launch: np.ndarray, prev_end: np.ndarray) -> dict[str, float]:
    pos = gap > 0
    g = gap[pos]
    host = np.nan_to_num(launch[pos], nan=-np.inf) > prev_end[pos]
    short = ~host & (g < LAUNCH_GAP_US) & np.isfinite(launch[pos])
    other = ~host & ~short
    total = float(g.sum())
    out = {"idle_gaps": int(pos.sum()), "idle_us": total, "host_wait_us": float(g[host].sum()),
           "launch_overhead_us": float(g[short].sum()), "other_us": float(g[other].sum())}
    for k in ("host_wait", "launch_overhead", "other"):
        out[f"{k}_ratio"] = out[f"{k}_us"] / total if total > 0 else np.nan
    return out
