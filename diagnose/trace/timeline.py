"""GPU time per rank and stream, and the attribution of idle gaps (interval arithmetic in numpy)."""

from __future__ import annotations

from typing import TypedDict

import numpy as np
import pandas as pd

LAUNCH_GAP_US = 30.0  # a gap shorter than this between back-to-back launched kernels is launch overhead
LAUNCH_EXPLAINED_MAX_US = 200.0  # a host gap before a promptly started eager kernel up to this is dispatch+launch


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


class GpuTimeRow(TypedDict):
    """One rank's GPU time over its traced window (all streams): the ``trace_gpu_time`` table's row."""

    rank: int
    window_us: float
    busy_us: float
    idle_us: float
    compute_us: float
    comm_exposed_us: float
    memory_exposed_us: float
    comm_total_us: float
    comm_overlapped_us: float
    busy_ratio: float
    idle_ratio: float
    compute_ratio: float
    comm_ratio: float
    memory_ratio: float
    comm_overlap_ratio: float
    kernels: int
    streams: int


def gpu_time(gpu: pd.DataFrame, cls: pd.Series, rank: int) -> tuple[GpuTimeRow, pd.DataFrame]:
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
    row: GpuTimeRow = {
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
    return launch_call_for(gpu, runtime)[0]


def launch_row_for(gpu: pd.DataFrame, runtime: pd.DataFrame) -> np.ndarray:
    """Per GPU event, the position in ``runtime`` of the call that launched it (same correlation id; -1 when
    none matches)."""
    out = np.full(len(gpu), -1, dtype=np.int64)
    pos = np.flatnonzero(runtime["corr"].to_numpy() >= 0) if len(runtime) else np.zeros(0, dtype=np.int64)
    if len(pos) == 0 or gpu.empty:
        return out
    rc = runtime["corr"].to_numpy()[pos]
    order = np.argsort(rc, kind="stable")
    rc, pos = rc[order], pos[order]
    gc = gpu["corr"].to_numpy()
    k = np.minimum(np.searchsorted(rc, gc), len(rc) - 1)
    hit = (rc[k] == gc) & (gc >= 0)
    out[hit] = pos[k[hit]]
    return out


def launch_call_for(gpu: pd.DataFrame, runtime: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Start and end time of the runtime call that launched each GPU event (NaN when none matches)."""
    out = np.full(len(gpu), np.nan)
    end = np.full(len(gpu), np.nan)
    row = launch_row_for(gpu, runtime)
    hit = row >= 0
    if hit.any():
        rts = runtime["ts_us"].to_numpy()[row[hit]]
        out[hit] = rts
        end[hit] = rts + runtime["dur_us"].to_numpy()[row[hit]]
    return out, end


def graph_follower(gpu: pd.DataFrame, runtime: pd.DataFrame) -> np.ndarray:
    """True for each GPU event that runs inside a graph replay and is not the replay's first kernel (it shares
    its correlation id with an earlier kernel): the gap before it is inside the replay, no launch explains it."""
    if gpu.empty:
        return np.zeros(0, dtype=bool)
    corr = gpu["corr"].to_numpy()
    order = np.lexsort((gpu["ts_us"].to_numpy(), corr))
    c = corr[order]
    follower = np.zeros(len(c), dtype=bool)
    follower[1:] = (c[1:] == c[:-1]) & (c[1:] >= 0)
    out = np.zeros(len(c), dtype=bool)
    out[order] = follower
    return out


def idle_attribution(gpu: pd.DataFrame, launch_ts: np.ndarray, rank: int,
                     launch_end: np.ndarray | None = None, in_graph: np.ndarray | None = None,
                     graph: np.ndarray | None = None) -> tuple[pd.DataFrame, dict[str, float], tuple[np.ndarray, np.ndarray]]:
    """Classify idle gaps per stream (HTA's rule) and for the whole GPU (gaps in the all-stream union).

    A gap before a GPU event is *host_wait* when the runtime call that launched the event started after the
    previous event ended (the CPU was late), but only up to the end of that call: when the event then waited
    more than 30 µs on the GPU side (stream/event waits, work launched before the trace began) the rest of the
    gap is *queued*. Otherwise *graph_internal* when the event is a later kernel of the same graph replay
    (no launch explains the gap); *launch_overhead* when the gap is under 30 µs (back-to-back kernels);
    else *other* (cross-stream waits, syncs, unmatched launches).

    *pre_trace* labels the queued idle before the first GPU event that started promptly after its launch: the
    GPU was then busy with work the trace does not show (launched before the trace began). Returns (per
    stream, whole GPU row, the pre-trace intervals (starts, ends)).
    """
    s = gpu["ts_us"].to_numpy()
    e = s + gpu["dur_us"].to_numpy()
    le = launch_ts if launch_end is None else launch_end
    ig = np.zeros(len(s), dtype=bool) if in_graph is None else in_graph
    rows = []
    for stream, idx in gpu.groupby("stream", sort=True, observed=True).indices.items():
        order = idx[np.argsort(s[idx], kind="stable")]
        ss, ee = s[order], e[order]
        prev_end = np.maximum.accumulate(ee)[:-1]
        gap = ss[1:] - prev_end
        split, _ = _split_gaps(gap, launch_ts[order][1:], le[order][1:], prev_end, ss[1:], ig[order][1:])
        rows.append({"rank": rank, "stream": int(stream), **split})
    per_stream = pd.DataFrame(rows)
    # whole GPU: gaps in the union of all streams, attributed to the event that ends each gap
    order = np.argsort(s, kind="stable")
    ss, ee = s[order], e[order]
    prev_end = np.maximum.accumulate(ee)[:-1]
    gap = ss[1:] - prev_end
    whole, pre = _split_gaps(gap, launch_ts[order][1:], le[order][1:], prev_end, ss[1:], ig[order][1:],
                             whole=True)
    # gaps a launch explains: before an eagerly launched kernel (not in a graph replay) that started within
    # 30 µs of its launch call's end (the CPU was behind the GPU), shorter than LAUNCH_EXPLAINED_MAX_US
    # (longer ones are host work, not per-kernel dispatch and launch)
    eager = np.ones(len(s), dtype=bool) if graph is None else ~graph
    d = _delay(ss[1:], le[order][1:])
    expl = (gap > 0) & eager[order][1:] & (d <= LAUNCH_GAP_US) & (gap <= LAUNCH_EXPLAINED_MAX_US)
    whole["launch_explained_us"] = float(gap[expl].sum())
    return per_stream, {"rank": rank, **whole}, pre


def _delay(start: np.ndarray, launch_end: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(launch_end), start - launch_end, np.inf)


def _split_gaps(gap: np.ndarray, launch: np.ndarray, launch_end: np.ndarray, prev_end: np.ndarray,
                start: np.ndarray, in_graph: np.ndarray, whole: bool = False,
                ) -> tuple[dict[str, float], tuple[np.ndarray, np.ndarray]]:
    known = np.isfinite(launch)
    delay = _delay(start, launch_end)
    late = known & (np.nan_to_num(launch, nan=-np.inf) > prev_end)
    queued_after = late & (delay > LAUNCH_GAP_US)
    pos = gap > 0
    host = np.where(late, np.where(queued_after, np.clip(launch_end - prev_end, 0, None), gap), 0.0)
    host = np.minimum(host, np.clip(gap, 0, None))
    queued = np.where(late, np.clip(gap, 0, None) - host, 0.0)
    graph = ~late & in_graph & (gap < LAUNCH_GAP_US)
    short = ~late & ~graph & (gap < LAUNCH_GAP_US) & known
    other = ~late & ~graph & ~short
    g = np.clip(gap, 0, None)
    total = float(g[pos].sum())
    # the pre-trace window: queued idle before the first event that started promptly after its launch
    pre_s, pre_e = np.zeros(0), np.zeros(0)
    pre_us = 0.0
    if whole and len(gap):
        prompt = np.flatnonzero(known & (delay <= LAUNCH_GAP_US))
        upto = int(prompt[0]) if len(prompt) else len(gap)
        sel = np.flatnonzero(pos[:upto] & (queued[:upto] > 0))
        pre_s, pre_e = start[sel] - queued[sel], start[sel]
        pre_us = float(queued[sel].sum())
    out = {"idle_gaps": int(pos.sum()), "idle_us": total, "host_wait_us": float(host[pos].sum()),
           "queued_us": float(queued[pos].sum()), "graph_internal_us": float(g[pos & graph].sum()),
           "launch_overhead_us": float(g[pos & short].sum()), "other_us": float(g[pos & other].sum()),
           "pre_trace_us": pre_us}
    judged = total - pre_us  # the pre-trace window is excluded from the shares
    for k in ("host_wait", "queued", "graph_internal", "launch_overhead", "other"):
        v = out[f"{k}_us"] - (pre_us if k == "queued" else 0.0)
        out[f"{k}_ratio"] = v / judged if judged > 0 else np.nan
    return out, (pre_s, pre_e)


def graph_kernels(gpu: pd.DataFrame) -> np.ndarray:
    """True for each GPU event that shares its correlation id with another one: a graph replay's kernels."""
    if gpu.empty:
        return np.zeros(0, dtype=bool)
    corr = gpu["corr"].to_numpy()
    _, inv, counts = np.unique(corr, return_inverse=True, return_counts=True)
    return (counts[inv] > 1) & (corr >= 0)


CUSTOM_ALLREDUCE = ("cross_device_reduce", "custom_all_reduce", "customallreduce", "one_shot", "two_shot",
                    "quickreduce", "mscclpp", "symm_mem")
COMM_OUTLIER_RATIO = 4.0  # a collective longer than this multiple of its kind's median waited for peers


def comm_split(gpu: pd.DataFrame, cls: pd.Series, rank: int, first_of_step: np.ndarray | None = None,
               ) -> pd.DataFrame:
    """Per communication kernel family (NCCL/RCCL vs custom all-reduce): count, time, and its split into
    *transfer* and *wait*. On one rank the tell of waiting for a peer rank that arrived late is the first
    collective of a step running far longer than its kind's median: *wait* is the excess over the median of
    such a first-of-step collective longer than COMM_OUTLIER_RATIO x the median of its kernel name (a larger
    message later in the step is not a wait); without steps nothing is called wait."""
    cols = ["rank", "impl", "kernels", "total_us", "transfer_us", "wait_us", "wait_kernels", "median_us"]
    m = cls.to_numpy() == "communication"
    if not m.any():
        return pd.DataFrame(columns=cols)
    names = gpu["name"].astype(str).to_numpy()[m]
    dur = gpu["dur_us"].to_numpy()[m]
    low = np.char.lower(names.astype(str))
    custom = np.array([any(c in n for c in CUSTOM_ALLREDUCE) for n in low], dtype=bool)
    df = pd.DataFrame({"name": names, "dur": dur, "impl": np.where(custom, "custom all-reduce", "nccl/rccl")})
    med = df.groupby("name")["dur"].transform("median").to_numpy()
    first = np.zeros(len(dur), dtype=bool) if first_of_step is None else first_of_step[m]
    outlier = first & (dur > COMM_OUTLIER_RATIO * med)
    df["wait"] = np.where(outlier, dur - med, 0.0)
    df["outlier"] = outlier
    g = df.groupby("impl").agg(kernels=("dur", "size"), total_us=("dur", "sum"), wait_us=("wait", "sum"),
                               wait_kernels=("outlier", "sum"), median_us=("dur", "median")).reset_index()
    g["transfer_us"] = g["total_us"] - g["wait_us"]
    g.insert(0, "rank", rank)
    return g[cols]


def first_comm_of_step(gpu: pd.DataFrame, cls: pd.Series, launch_ts: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """True for the earliest communication kernel launched inside each step's CPU interval."""
    out = np.zeros(len(gpu), dtype=bool)
    if gpu.empty or steps.empty:
        return out
    st = steps["ts_us"].to_numpy(dtype=float)
    en = st + steps["dur_us"].to_numpy(dtype=float)
    comm = np.flatnonzero(cls.to_numpy() == "communication")
    if not len(comm):
        return out
    lt = launch_ts[comm]
    k = np.searchsorted(st, lt, side="right") - 1
    ok = np.isfinite(lt) & (k >= 0)
    ok[ok] &= lt[ok] <= en[k[ok]]
    comm, k = comm[ok], k[ok]
    ts = gpu["ts_us"].to_numpy()[comm]
    order = np.lexsort((ts, k))
    comm, k = comm[order], k[order]
    firsts = comm[np.r_[True, k[1:] != k[:-1]]] if len(comm) else comm
    out[firsts] = True
    return out
