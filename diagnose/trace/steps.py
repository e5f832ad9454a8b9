"""Serving structure: engine steps from user annotations (vLLM, SGLang, ProfilerStep) and their GPU use."""

from __future__ import annotations

import re
from typing import TypedDict

import numpy as np
import pandas as pd

from diagnose.trace.capture import steps_in_capture
from diagnose.trace.classify import KERNEL_CLASSES
from diagnose.trace.timeline import clipped_union_len, union, union_len

# vLLM: execute_context_1(200)_generation_0(0), execute_32_context_0(sq0sk0..)_generation_32(sq32sk55086..)
_VLLM = re.compile(r"^execute(?:_\d+)?_context_(\d+)\(([^)]*)\)_generation_(\d+)\(([^)]*)\)")
# SGLang: step[DECODE bs=32], step[EXTEND bs=4], step[MIXED ...]
_SGLANG = re.compile(r"^step\[(\w+)(?:[^\]]*?bs=(\d+))?")
_PROFSTEP = re.compile(r"^ProfilerStep#(\d+)")
# vLLM V1: no step annotation; the worker's Python frame of each step (kept by columns.STEP_FRAME)
_V1_FRAME = re.compile(r"(?:gpu_model_runner|model_runner|gpu_worker)\.py\(\d+\): execute_model$")
# vLLM V1 ranges (user annotations with VLLM_CUSTOM_SCOPES_FOR_PROFILING=1, NVTX ranges with
# VLLM_NVTX_SCOPES_FOR_PROFILING=1 once exported to a Chrome trace): an explicit execute_model range, or the
# runner's scopes of one step, "gpu_model_runner: preprocess" (opens each step), "...: forward",
# "...: postprocess", "...: sample" etc. (vllm/v1/worker/gpu_model_runner.py, record_function_or_nullcontext)
_V1_RANGE = re.compile(r"(?:^|[:./ ])execute_model$")
_V1_SCOPE = re.compile(r"^gpu_model_runner: (\w+)$")
V1_SOURCES = ("vllm_v1_frame", "vllm_v1_range")  # steps without token counts: kinds inferred from GPU time
PREFILL_INFER_RATIO = 2.0  # a V1 step whose GPU time exceeds this multiple of the median step is a prefill
_SGLANG_TYPES = {"DECODE": "decode", "EXTEND": "prefill", "PREFILL": "prefill", "MIXED": "mixed", "IDLE": "idle"}
MEMORY_BOUND_CLASSES = ("memory", "norm_elementwise", "attention", "sampling")


def _tokens(spec: str) -> int:
    m = re.search(r"sq(\d+)", spec) or re.search(r"(\d+)", spec)
    return int(m.group(1)) if m else 0


def _step_no(name: str) -> int:
    m = _PROFSTEP.match(name)
    return int(m.group(1)) if m else -1


class StepFields(TypedDict):
    """What a step annotation's name says of its step."""

    source: str  # "vllm" | "sglang" | "profiler_step" | "vllm_v1_frame" | "vllm_v1_range"
    step_type: str
    prefill_reqs: int
    prefill_tokens: int
    decode_reqs: int
    decode_tokens: int


class StepRow(StepFields):
    """A step found in the trace, before the per-step table numbers it (``find_steps``)."""

    ts_us: float
    dur_us: float
    excluded: str  # why the step is left out of the statistics; "" when counted


class GraphMode(TypedDict, total=False):
    """``graph_mode``: empty when no step launched a kernel."""

    mode: str  # "eager" | "full graph" | "piecewise"
    steps: int
    replays_per_step: float
    eager_kernels_per_step: float
    eager_gpu_share: float
    idle_between_us_per_step: float
    recover_share: float


def parse_step_name(name: str) -> StepFields | None:
    """Step fields from an annotation name, or None when it is not a step annotation."""
    m = _VLLM.match(name)
    if m:
        pr, pt, dr, dt = int(m.group(1)), _tokens(m.group(2)), int(m.group(3)), _tokens(m.group(4))
        kind = "mixed" if pr and dr else "prefill" if pr else "decode" if dr else "idle"
        return {"source": "vllm", "step_type": kind, "prefill_reqs": pr, "prefill_tokens": pt,
                "decode_reqs": dr, "decode_tokens": dt}
    m = _SGLANG.match(name)
    if m:
        kind = _SGLANG_TYPES.get(m.group(1).upper(), "unknown")
        bs = int(m.group(2)) if m.group(2) else 0
        return {"source": "sglang", "step_type": kind, "prefill_reqs": bs if kind == "prefill" else 0,
                "prefill_tokens": 0, "decode_reqs": bs if kind == "decode" else 0,
                "decode_tokens": bs if kind == "decode" else 0}
    m = _PROFSTEP.match(name)
    if m:
        return {"source": "profiler_step", "step_type": "step", "prefill_reqs": 0, "prefill_tokens": 0,
                "decode_reqs": 0, "decode_tokens": 0}
    return None


STEP_COLUMNS = ["rank", "step", "source", "step_type", "kind_from", "ts_us", "dur_us", "prefill_reqs",
                "prefill_tokens", "decode_reqs", "decode_tokens", "excluded"]
# Profiler artefacts (issue 11): a step is excluded from percentiles, graph mode, signals and findings, and kept
# in the per-step table with the reason, when it is
# - warm-up: ProfilerStep#0 (numbers start at 0 only when the schedule had no wait/warm-up steps, whose purpose
#   per the torch.profiler docs is to keep the tracing start-up overhead out of the results), or one of the leading steps that call cudaMalloc/hipMalloc while a later step calls none (first-run
#   allocation: the caching allocator grows);
# - profiler start: the first step, whose CPU duration exceeds PROFILER_START_RATIO x the median of at least
#   ARTEFACT_MIN_OTHERS later steps of its kind (profiler start-up overhead lands on it);
# - profiler stop: the last step, whose CPU duration is under PROFILER_STOP_RATIO x the median of the other
#   steps of its kind (the profiler stopped mid-step and closed it).
PROFILER_START_RATIO = 1.3
PROFILER_STOP_RATIO = 0.25
ARTEFACT_MIN_OTHERS = 3
WARMUP_STEP0 = ("warm-up: ProfilerStep#0, recorded without a warm-up step in the profiler schedule, carries the "
                "profiler's start-up overhead and first-iteration costs")
_MALLOC = re.compile(r"^(?:cuda|hip)Malloc(?:Managed)?$")


def _frame_steps(frames: pd.DataFrame | None) -> list[StepRow]:
    if frames is None or frames.empty:
        return []
    names = frames["name"].astype(str).to_numpy()
    hit = np.array([bool(_V1_FRAME.search(n)) for n in names], dtype=bool)
    ts, dur = frames["ts_us"].to_numpy()[hit], frames["dur_us"].to_numpy()[hit]
    return [_row(a, b, "vllm_v1_frame") for a, b in zip(ts, dur, strict=True)]


def outermost(rows: list[StepRow]) -> list[StepRow]:
    """The rows whose interval no other row contains: one step per outermost engine-step frame. vLLM V1 nests
    the model runner's ``execute_model`` frame inside the worker's (gpu_worker.py), and an ``execute_model``
    annotation / NVTX range can wrap either; counting each would report every step twice (issue 35). Of two
    rows with the same interval the first is kept."""
    if len(rows) < 2:
        return rows
    order = sorted(range(len(rows)), key=lambda i: (float(rows[i]["ts_us"]), -float(rows[i]["dur_us"]), i))
    kept: list[StepRow] = []
    end = -np.inf
    for i in order:
        r = rows[i]
        a, b = float(r["ts_us"]), float(r["ts_us"]) + float(r["dur_us"])
        if kept and a >= float(kept[-1]["ts_us"]) and b <= end:
            continue  # inside the last kept (outermost) row
        kept.append(r)
        end = b
    return kept


def _row(ts: float, dur: float, source: str) -> StepRow:
    return {"ts_us": ts, "dur_us": dur, "source": source, "step_type": "unknown", "prefill_reqs": 0,
            "prefill_tokens": 0, "decode_reqs": 0, "decode_tokens": 0, "excluded": ""}


def _range_steps(names: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> list[StepRow]:
    """vLLM V1 steps from annotation / NVTX ranges: each explicit ``execute_model`` range is a step; without
    one, a step runs from a ``gpu_model_runner: preprocess`` scope to the end of the runner scopes that follow
    it before the next preprocess (scopes before the first preprocess belong to a step the trace cut)."""
    uniq = [str(u) for u in pd.unique(names)]
    explicit = {u for u in uniq if _V1_RANGE.search(u)}
    if explicit:
        hit = np.isin(names, list(explicit))
        return [_row(a, b, "vllm_v1_range") for a, b in zip(ts[hit], dur[hit], strict=True)]
    scopes = {u: m.group(1) for u in uniq if (m := _V1_SCOPE.match(u))}
    if "preprocess" not in scopes.values():
        return []
    hit = np.isin(names, list(scopes))
    order = np.argsort(ts[hit], kind="stable")
    s_names, s_ts = names[hit][order], ts[hit][order]
    s_end = s_ts + dur[hit][order]
    rows: list[StepRow] = []
    start = end = float("nan")
    for name, a, b in zip(s_names, s_ts, s_end, strict=True):
        if scopes[str(name)] == "preprocess":
            if np.isfinite(start):
                rows.append(_row(start, end - start, "vllm_v1_range"))
            start, end = float(a), float(b)
        elif np.isfinite(start):
            end = max(end, float(b))
    if np.isfinite(start):
        rows.append(_row(start, end - start, "vllm_v1_range"))
    return rows


def _has_profiler_step(names: pd.Series) -> bool:
    uniq = pd.unique(names.to_numpy()) if len(names) else []
    return any(_PROFSTEP.match(str(u)) for u in uniq)


def with_op_profiler_steps(annotations: pd.DataFrame, cpu_ops: pd.DataFrame | None) -> pd.DataFrame:
    """The annotations plus ``ProfilerStep#N`` recorded as an operator (category ``Operator``/``cpu_op``, as
    Kineto did in 2021, e.g. the kineto tb_plugin ResNet-50 samples) when no annotation carries it."""
    if cpu_ops is None or cpu_ops.empty or (len(annotations) and _has_profiler_step(annotations["name"])):
        return annotations
    codes, uniq = pd.factorize(cpu_ops["name"], sort=False)
    hit = np.isin(codes, [i for i, u in enumerate(uniq) if _PROFSTEP.match(str(u))])
    if not hit.any():
        return annotations
    extra = cpu_ops.loc[hit, ["name", "tid", "ts_us", "dur_us"]].assign(where="cpu")
    extra["name"] = extra["name"].astype(str)
    base = annotations.assign(name=annotations["name"].astype(str)) if len(annotations) else annotations
    return pd.concat([base, extra], ignore_index=True) if len(base) else extra.reset_index(drop=True)


def find_steps(annotations: pd.DataFrame, rank: int, frames: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per engine step, the most specific source only: vLLM V0 annotations, SGLang annotations,
    vLLM V1 ``execute_model`` frames, then ``ProfilerStep#``."""
    ann = annotations[annotations["where"] == "cpu"]
    cols = STEP_COLUMNS
    v1 = _frame_steps(frames)
    if ann.empty and not v1:
        return pd.DataFrame(columns=cols)
    names = ann["name"].astype(str) if len(ann) else pd.Series([], dtype=object)
    parsed = {n: parse_step_name(n) for n in pd.unique(names.to_numpy())}
    rows: list[StepRow] = []
    for name, ts, dur in zip(names.to_numpy(), ann["ts_us"].to_numpy(), ann["dur_us"].to_numpy(), strict=True):
        p = parsed[str(name)]
        if p is not None:
            rows.append({"ts_us": ts, "dur_us": dur, **p,
                         "excluded": WARMUP_STEP0 if p["source"] == "profiler_step" and _step_no(str(name)) == 0
                         else ""})
    rows += v1
    if len(ann):
        rows += _range_steps(names.to_numpy(dtype=object), ann["ts_us"].to_numpy(dtype=float),
                             ann["dur_us"].to_numpy(dtype=float))
    if not rows:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(rows)
    best = next(s for s in ("vllm", "sglang", "vllm_v1_frame", "vllm_v1_range", "profiler_step")
                if (df["source"] == s).any())
    if best in V1_SOURCES:  # frames and ranges of one step nest: the outermost of either counts, once
        df = pd.DataFrame(outermost([r for r in rows if r["source"] in V1_SOURCES]))
    else:
        df = df[df["source"] == best]
    df = df.sort_values("ts_us", ignore_index=True)
    df["kind_from"] = ("inferred: GPU time over 2x the median step = prefill" if best in V1_SOURCES else
                       "none" if best == "profiler_step" else "annotation name")
    df.insert(0, "step", np.arange(len(df)))
    df.insert(0, "rank", rank)
    return df[cols]


def step_gpu_use(steps: pd.DataFrame, gpu: pd.DataFrame, cls: pd.Series, launch_ts: np.ndarray,
                 sync: tuple[np.ndarray, np.ndarray] | None,
                 pre_trace: tuple[np.ndarray, np.ndarray] | None = None,
                 graph_kernel: np.ndarray | None = None, memory_gemm: np.ndarray | None = None) -> pd.DataFrame:
    """Adds per-step GPU use, memory-bound kernel time, host-sync time and the CPU gap before each step.

    A kernel belongs to the step whose CPU interval contains the start of the runtime call that launched it.
    ``gpu_busy_ratio`` = union of the step's kernel intervals / the step's GPU span (step start to the later of
    the step end and its last kernel end). ``gpu_dur_us`` = first kernel start to last kernel end of the step;
    from the step start to its first kernel, ``queued_before_first_us`` is the time the GPU still ran work
    queued before the step (the previous step's kernels, work launched before the trace) and
    ``idle_before_first_us`` the rest (the GPU ran nothing); the GPU idle inside the step's span is located:
    ``idle_before_first_us``,
    ``idle_between_us`` (between the step's kernels, e.g. between graph replays), ``idle_after_last_us``
    (last kernel end to the CPU step end). ``sync_blocking_us`` = the part of the step's sync calls when the GPU
    was idle (not running any kernel, nor work from before the trace): only that part blocks the GPU.
    ``graph_replays`` / ``eager_kernels`` / ``eager_gpu_us``: the step's graph launches, kernels launched one
    by one, and their GPU time. ``<class>_us``: kernel time per class. ``memory_bound_us``: kernel time in the
    memory-bound classes and in the GEMMs ``memory_gemm`` marks (memory-bound by their shapes: trace/gemm.py).
    """
    out = steps.copy()
    n = len(out)
    st = out["ts_us"].to_numpy(dtype=float)
    en = st + out["dur_us"].to_numpy(dtype=float)
    gap = np.full(n, np.nan)
    if n > 1:
        gap[1:] = st[1:] - np.maximum.accumulate(en)[:-1]
    out["cpu_gap_before_us"] = gap
    gs = gpu["ts_us"].to_numpy() if len(gpu) else np.zeros(0)
    ge = gs + gpu["dur_us"].to_numpy() if len(gpu) else np.zeros(0)
    # host sync / synchronous copies inside each step (CPU time, clipped to the step) and the part of it when
    # the GPU was idle
    ss, se = sync if sync is not None else (np.zeros(0), np.zeros(0))
    sync_us = np.zeros(n) if sync is not None else np.full(n, np.nan)
    blocking = sync_us.copy()
    if len(ss) and n:
        ps, pe = pre_trace if pre_trace is not None else (np.zeros(0), np.zeros(0))
        bs, be = union(np.concatenate([gs, ps]), np.concatenate([ge, pe]))
        for i in range(n):
            lo = np.maximum(ss, st[i])
            hi = np.minimum(se, en[i])
            m = hi > lo
            if not m.any():
                continue
            sync_us[i] = float((hi[m] - lo[m]).sum())
            blocking[i] = sync_us[i] - float(clipped_union_len(bs, be, lo[m], hi[m]).sum())
    out["sync_us"] = sync_us
    out["sync_blocking_us"] = np.clip(blocking, 0, None)
    new_cols = ["gpu_busy_us", "kernel_us", "memory_bound_us", "gpu_busy_ratio", "gpu_span_us", "gpu_dur_us",
                "queued_before_first_us", "idle_before_first_us", "idle_between_us", "idle_after_last_us", "kernels", "graph_replays",
                "eager_kernels", "eager_gpu_us", *[f"{c}_us" for c in KERNEL_CLASSES]]
    for c in new_cols:
        out[c] = np.nan
    if gpu.empty or n == 0:
        return _infer_kinds(out)
    k = np.searchsorted(st, launch_ts, side="right") - 1
    ok = np.isfinite(launch_ts) & (k >= 0)
    ok[ok] &= launch_ts[ok] <= en[k[ok]]
    c = cls.to_numpy()
    mb = np.isin(c, MEMORY_BOUND_CLASSES)
    if memory_gemm is not None:
        mb |= memory_gemm
    corr = gpu["corr"].to_numpy()
    gk = np.zeros(len(gs), dtype=bool) if graph_kernel is None else graph_kernel
    pre_s, pre_e = union(*pre_trace) if pre_trace is not None else (np.zeros(0), np.zeros(0))
    bus_s, bus_e = union(np.concatenate([gs, pre_s]), np.concatenate([ge, pre_e]))  # the GPU running anything
    idx = np.flatnonzero(ok)
    if len(idx) == 0:
        return _infer_kinds(out)
    kk = k[idx]
    order = np.argsort(kk, kind="stable")
    idx, kk = idx[order], kk[order]
    bounds = np.flatnonzero(np.r_[True, kk[1:] != kk[:-1], True])
    vals = {col: np.full(n, np.nan) for col in new_cols}
    gpu_end = np.zeros(n)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        sel = idx[a:b]
        step = kk[a]
        busy = union_len(gs[sel], ge[sel])
        first, last = float(gs[sel].min()), float(ge[sel].max())
        d = ge[sel] - gs[sel]
        g = gk[sel]
        vals["gpu_busy_us"][step] = busy
        vals["kernel_us"][step] = d.sum()
        vals["memory_bound_us"][step] = d[mb[sel]].sum()
        vals["gpu_dur_us"][step] = last - first
        # before the first kernel the GPU may still run work queued earlier (the previous step's kernels, or
        # work launched before the trace): that part is queued, not idle
        before = max(0.0, first - st[step])
        queued = float(clipped_union_len(bus_s, bus_e, np.array([st[step]]), np.array([first]))[0]) if before else 0.0
        vals["queued_before_first_us"][step] = min(before, queued)
        vals["idle_before_first_us"][step] = max(0.0, before - queued)
        between = (last - first) - busy
        if len(pre_s):  # the GPU ran work from before the trace then: not idle
            between -= float(clipped_union_len(pre_s, pre_e, np.array([first]), np.array([last]))[0])
        vals["idle_between_us"][step] = max(0.0, between)
        vals["idle_after_last_us"][step] = max(0.0, en[step] - last)
        vals["kernels"][step] = len(sel)
        vals["graph_replays"][step] = len(np.unique(corr[sel][g]))
        vals["eager_kernels"][step] = int((~g).sum())
        vals["eager_gpu_us"][step] = d[~g].sum()
        for cl in KERNEL_CLASSES:
            vals[f"{cl}_us"][step] = d[c[sel] == cl].sum()
        gpu_end[step] = last
    has = np.isfinite(vals["kernel_us"])
    for col in new_cols:
        if col not in ("gpu_busy_ratio", "gpu_span_us"):
            out[col] = vals[col]
    # the step's GPU span: from the step start to whichever ends last, the CPU step or its kernels (kernels
    # of a graph replay run after the CPU side has returned)
    span = np.maximum(en, gpu_end) - st
    if len(pre_s):  # less the time the GPU ran work from before the trace
        span = span - clipped_union_len(pre_s, pre_e, st, np.maximum(en, gpu_end))
    out["gpu_span_us"] = np.where(has, span, np.nan)
    out["gpu_busy_ratio"] = np.where(has & (span > 0), vals["gpu_busy_us"] / np.where(span > 0, span, 1), np.nan)
    return _infer_kinds(out)


def _infer_kinds(out: pd.DataFrame) -> pd.DataFrame:
    """vLLM V1 frames carry no token counts: a step whose GPU time (``kernel_us``) exceeds PREFILL_INFER_RATIO
    times the median step's is a prefill, the others decodes; with fewer than 3 steps the kind stays unknown."""
    v1 = out["source"].isin(V1_SOURCES).to_numpy() if len(out) else np.zeros(0, dtype=bool)
    if not v1.any():
        return out
    gt = out.loc[v1, "kernel_us"].to_numpy(dtype=float)
    if np.isfinite(gt).sum() < 3:
        return out
    med = float(np.nanmedian(gt))
    out.loc[v1, "step_type"] = np.where(gt > PREFILL_INFER_RATIO * med, "prefill", "decode")
    return out


def _others_median(dur: np.ndarray, kind: np.ndarray, keep: np.ndarray, i: int) -> tuple[float, int]:
    """Median CPU duration of the kept steps of step i's kind other than i, and how many there are."""
    m = keep & (kind == kind[i])
    m[i] = False
    n = int(m.sum())
    return (float(np.median(dur[m])), n) if n else (float("nan"), 0)


def mark_artefacts(steps: pd.DataFrame, runtime: pd.DataFrame | None = None,
                   capture: tuple[np.ndarray, np.ndarray] | None = None) -> pd.DataFrame:
    """Sets ``excluded`` (empty = the step counts) for graph-capture steps (a step overlapping a ``capture``
    mark, diagnose/trace/capture.py: it records graphs rather than runs them), warm-up and profiler
    start/stop steps (rules at PROFILER_START_RATIO above); a trace's only step stays counted unless it
    captures."""
    out = steps.copy()
    if "excluded" not in out:
        out["excluded"] = ""
    n = len(out)
    if n == 0:
        return out
    exc = out["excluded"].fillna("").astype(str).to_numpy(dtype=object)
    if n == 1:  # a trace's only step stays counted (its figures then say they rest on one step)
        exc[:] = ""
    st = out["ts_us"].to_numpy(dtype=float)
    en = st + out["dur_us"].to_numpy(dtype=float)
    if capture is not None:
        caps = steps_in_capture(st, en, capture)
        for j in np.flatnonzero(caps).tolist():
            exc[j] = (f"graph capture: the step records CUDA/HIP graphs ({int(caps[j])} capture mark"
                      f"{'s' if caps[j] != 1 else ''}: stream capture, capture annotation or frame), not serving")
    dur = out["dur_us"].to_numpy(dtype=float)
    kind = out["step_type"].astype(str).to_numpy()
    if runtime is not None and len(runtime):
        codes, uniq = pd.factorize(runtime["name"], sort=False)  # match the unique names only
        hit = np.isin(codes, [i for i, u in enumerate(uniq) if _MALLOC.match(str(u))])
        mts = np.sort(runtime["ts_us"].to_numpy(dtype=float)[hit])
        if len(mts):
            calls = np.searchsorted(mts, en, side="right") - np.searchsorted(mts, st, side="left")
            lead = 0
            while lead < n and calls[lead] > 0:
                lead += 1
            if 0 < lead < n:  # a later step allocates nothing: the leading ones are first-run allocation
                for i in range(lead):
                    if not exc[i]:
                        exc[i] = (f"warm-up: {int(calls[i])} cudaMalloc/hipMalloc call"
                                  f"{'s' if calls[i] != 1 else ''} in the step (first-run allocation)")
    keep = exc == ""
    live = np.flatnonzero(keep)
    if len(live) >= 2:
        first, last = int(live[0]), int(live[-1])
        med, others = _others_median(dur, kind, keep, first)
        if others >= ARTEFACT_MIN_OTHERS and dur[first] > PROFILER_START_RATIO * med:
            exc[first] = (f"profiler start: CPU duration {dur[first] / 1e3:.2f} ms, {dur[first] / med:.1f}x the "
                          f"median of the {others} other {kind[first]} steps (profiler start-up overhead)")
            keep[first] = False
        med, others = _others_median(dur, kind, keep, last)
        if others >= 1 and keep[last] and dur[last] < PROFILER_STOP_RATIO * med:
            exc[last] = (f"profiler stop: cut short when the profiler stopped (CPU duration {dur[last] / 1e3:.2f} "
                         f"ms, {dur[last] / med:.0%} of the median {kind[last]} step)")
    out["excluded"] = exc
    return out


def outside_artefacts(steps: pd.DataFrame, launch_ts: np.ndarray,
                      runtime: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(GPU rows, runtime rows) to keep for the window-level analyses: all but the kernels launched inside an
    excluded step and the runtime calls that start inside one."""
    keep_gpu = np.ones(len(launch_ts), dtype=bool)
    keep_rt = np.ones(len(runtime), dtype=bool)
    if steps.empty or "excluded" not in steps:
        return keep_gpu, keep_rt
    exc = steps[steps["excluded"].fillna("").astype(str) != ""]
    if exc.empty:
        return keep_gpu, keep_rt
    rts = runtime["ts_us"].to_numpy(dtype=float) if len(runtime) else np.zeros(0)
    for a, d in zip(exc["ts_us"].to_numpy(dtype=float), exc["dur_us"].to_numpy(dtype=float), strict=True):
        keep_gpu &= ~((launch_ts >= a) & (launch_ts <= a + d))
        keep_rt &= ~((rts >= a) & (rts <= a + d))
    return keep_gpu, keep_rt


def included(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps that count: all but the warm-up and profiler start/stop artefacts (``excluded`` set)."""
    if steps.empty or "excluded" not in steps:
        return steps
    return steps[steps["excluded"].fillna("").astype(str) == ""]


def step_summary(steps: pd.DataFrame) -> pd.DataFrame:
    """Per step type: count, duration distribution, tokens per step, GPU busy share, CPU gap."""
    cols = ["step_type", "steps", "dur_ms_mean", "dur_ms_p50", "dur_ms_p99", "tokens_mean",
            "gpu_busy_ratio_mean", "cpu_gap_ms_p50", "sync_ms_mean"]
    steps = included(steps)
    if steps.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for kind, g in steps.groupby("step_type", sort=True):
        d = g["dur_us"].to_numpy(dtype=float) / 1e3
        toks = (g["prefill_tokens"] + g["decode_tokens"]).to_numpy(dtype=float)
        gaps = g["cpu_gap_before_us"].dropna().to_numpy(dtype=float) / 1e3
        rows.append({"step_type": kind, "steps": len(g), "dur_ms_mean": float(d.mean()),
                     "dur_ms_p50": float(np.percentile(d, 50)), "dur_ms_p99": float(np.percentile(d, 99)),
                     "tokens_mean": float(toks.mean()),
                     "gpu_busy_ratio_mean": float(g["gpu_busy_ratio"].mean()) if g["gpu_busy_ratio"].notna().any()
                     else np.nan,
                     "cpu_gap_ms_p50": float(np.percentile(gaps, 50)) if len(gaps) else np.nan,
                     "sync_ms_mean": float(g["sync_us"].mean() / 1e3) if g["sync_us"].notna().any() else np.nan})
    return pd.DataFrame(rows, columns=cols)


PERCENTILE_METRICS = (("dur_us", "CPU duration"), ("gpu_dur_us", "GPU duration (its kernels)"),
                      ("gpu_busy_ratio", "GPU busy share"), ("queued_before_first_us", "GPU still running earlier work before first kernel"),
                      ("idle_before_first_us", "GPU idle before first kernel"),
                      ("idle_between_us", "GPU idle between its kernels / graph replays"),
                      ("idle_after_last_us", "host gap after last kernel"),
                      ("sync_blocking_us", "sync while the GPU was idle"))


def step_percentiles(steps: pd.DataFrame) -> pd.DataFrame:
    """Percentiles over steps (P50, P90, P99, max) per step kind and for all steps, one row per metric."""
    cols = ["step_type", "metric", "steps", "p50", "p90", "p99", "max"]
    steps = included(steps)
    if steps.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    groups = [("all", steps)] + ([(str(k), g) for k, g in steps.groupby("step_type", sort=True)]
                                 if steps["step_type"].nunique() > 1 else [])
    for kind, g in groups:
        for col, label in PERCENTILE_METRICS:
            if col not in g:
                continue
            v = g[col].to_numpy(dtype=float)
            v = v[np.isfinite(v)]
            if not len(v):
                continue
            rows.append({"step_type": kind, "metric": f"{label} ({col})", "steps": len(v),
                         "p50": float(np.percentile(v, 50)), "p90": float(np.percentile(v, 90)),
                         "p99": float(np.percentile(v, 99)), "max": float(v.max())})
    return pd.DataFrame(rows, columns=cols)


def graph_mode(steps: pd.DataFrame) -> GraphMode:
    """Graph mode of the steps that launched kernels: eager (no graph replay), full graph (one replay and at
    most a few eager kernels per step, eager kernels under 5% of the step's GPU time) or piecewise; per step
    (median) replays and eager kernels, the eager share of step GPU time, and what a full graph would at most
    recover (the GPU idle between the step's kernels, per step)."""
    if steps.empty or "kernels" not in steps or not steps["kernels"].notna().any():
        return {}
    s = steps[steps["kernels"].notna()]
    replays = float(s["graph_replays"].median())
    eager = float(s["eager_kernels"].median())
    ktime = float(s["kernel_us"].sum())
    eager_share = float(s["eager_gpu_us"].sum()) / ktime if ktime > 0 else float("nan")
    if float(s["graph_replays"].sum()) == 0:
        mode = "eager"
    elif replays <= 1 and eager_share < 0.05:
        mode = "full graph"
    else:
        mode = "piecewise"
    between = float(s["idle_between_us"].median())
    gdur = float(s["gpu_dur_us"].median())
    return {"mode": mode, "steps": len(s), "replays_per_step": replays, "eager_kernels_per_step": eager,
            "eager_gpu_share": eager_share, "idle_between_us_per_step": between,
            "recover_share": between / gdur if gdur > 0 else float("nan")}


def graph_mode_sentence(gm: GraphMode) -> str:
    if not gm:
        return ""
    n = gm["steps"]
    per = f"per step (median over {n} step{'s' if n != 1 else ''})"
    if gm["mode"] == "eager":
        head = (f"Eager: no graph replay; {gm['eager_kernels_per_step']:.0f} kernels launched one by one {per}.")
    elif gm["mode"] == "full graph":
        head = (f"Full graph: {gm['replays_per_step']:.0f} graph replay and {gm['eager_kernels_per_step']:.0f} "
                f"eager kernels {per}; eager kernels are {gm['eager_gpu_share']:.0%} of step GPU time.")
    else:
        head = (f"Piecewise graphs: {gm['replays_per_step']:.0f} graph replays and {gm['eager_kernels_per_step']:.0f} "
                f"eager kernels {per}; eager kernels are {gm['eager_gpu_share']:.0%} of step GPU time.")
    if gm["mode"] == "full graph":
        tail = (f" GPU idle between the step's kernels: {gm['idle_between_us_per_step'] / 1e3:.2f} ms per step "
                f"({gm['recover_share']:.0%} of its GPU duration).")
    else:
        tail = (f" A full graph would at most recover the GPU idle between the step's kernels: "
                f"{gm['idle_between_us_per_step'] / 1e3:.2f} ms per step ({gm['recover_share']:.0%} of its GPU "
                "duration).")
    return head + tail


GRAPH_MODE_COLUMNS = ["rank", "mode", "steps", "replays_per_step", "eager_kernels_per_step", "eager_gpu_share",
                      "idle_between_us_per_step", "recover_share", "sentence"]


def graph_mode_table(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per rank: graph_mode() and its sentence."""
    rows = []
    steps = included(steps)
    if not steps.empty:
        for rank, g in steps.groupby("rank", sort=True):
            gm = graph_mode(g)
            if gm:
                rows.append({"rank": int(rank), **gm, "sentence": graph_mode_sentence(gm)})
    return pd.DataFrame(rows, columns=GRAPH_MODE_COLUMNS)


def steps_sentence(steps: pd.DataFrame) -> str:
    """The per-step summary in words: how many steps of which kind (and how the kind is known), CPU and GPU
    duration, GPU busy share and where the host gap sits inside the step (medians over steps)."""
    if steps.empty:
        return ""
    dropped = excluded_note(steps)
    steps = included(steps)
    if steps.empty:
        return f"Steps: none counted; {dropped}."
    n = len(steps)
    kinds = steps["step_type"].value_counts()
    src = str(steps["source"].iloc[0])
    what = {"vllm": "vLLM step annotations", "sglang": "SGLang step annotations",
            "vllm_v1_frame": "vLLM V1 execute_model frames",
            "vllm_v1_range": "vLLM V1 execute_model ranges (annotation / NVTX)",
            "profiler_step": "ProfilerStep ranges"}.get(src, src)
    how = str(steps["kind_from"].iloc[0]) if "kind_from" in steps else ""
    if src == "profiler_step":
        head = f"{n} step{'s' if n != 1 else ''} ({what}; no step kind)"
    else:
        kind_txt = ", ".join(f"{int(c)} {k}" for k, c in kinds.items())
        head = f"{n} step{'s' if n != 1 else ''} ({kind_txt}; from {what}, kind from the {how.split(': ')[-1]})"
    parts = [head]
    tok = (steps["prefill_tokens"] + steps["decode_tokens"]).to_numpy(dtype=float)
    if tok.sum() > 0:
        parts.append(f"tokens per step P50 {np.percentile(tok, 50):.0f}")
    med = {c: float(np.nanmedian(steps[c].to_numpy(dtype=float))) if c in steps and steps[c].notna().any()
           else float("nan") for c in ("dur_us", "gpu_dur_us", "gpu_busy_ratio", "idle_before_first_us",
                                        "idle_between_us", "idle_after_last_us", "queued_before_first_us")}
    parts.append(f"CPU duration P50 {med['dur_us'] / 1e3:.2f} ms")
    if np.isfinite(med["gpu_dur_us"]):
        parts.append(f"GPU duration (its kernels) P50 {med['gpu_dur_us'] / 1e3:.2f} ms, GPU busy share P50 "
                     f"{med['gpu_busy_ratio']:.0%}; GPU idle inside the step (P50): {med['idle_before_first_us'] / 1e3:.2f}"
                     f" ms before the first kernel, {med['idle_between_us'] / 1e3:.2f} ms between its kernels / graph "
                     f"replays, {med['idle_after_last_us'] / 1e3:.2f} ms after the last")
        if med["queued_before_first_us"] > 0:
            parts.append(f"before its first kernel the GPU still ran work queued earlier for "
                         f"{med['queued_before_first_us'] / 1e3:.2f} ms (P50; not idle)")
    if n == 1:
        parts.append("one step only: every per-step figure rests on it")
    if dropped:
        parts.append(dropped)
    return "Steps: " + "; ".join(parts) + "."


def excluded_note(steps: pd.DataFrame) -> str:
    """'2 steps excluded (1 warm-up, 1 profiler stop): not in the percentiles or findings', or ''."""
    if steps.empty or "excluded" not in steps:
        return ""
    why = steps["excluded"].fillna("").astype(str)
    why = why[why != ""].str.split(":").str[0]
    if why.empty:
        return ""
    counts = ", ".join(f"{int(c)} {k}" for k, c in why.value_counts().sort_index().items())
    return (f"{len(why)} step{'s' if len(why) != 1 else ''} excluded ({counts}; see the per-step table): not in "
            "the percentiles or findings")
