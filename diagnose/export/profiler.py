"""The engine profiler's traces (torch.profiler / Kineto) as Chrome-trace events on the bundle's clock.

Each trace is read with the analysis's streaming reader (diagnose/trace/parse.py: the file is never held
whole), so what comes out is the trace *normalised*: per rank one process for the host (a thread per trace
thread: CPU operators, CUDA runtime calls, user annotations such as ``ProfilerStep#N``) and one per GPU (a
thread per stream: kernels, memcpy, memset, GPU annotations), plus a flow arrow from each launch to its
kernel (matched by correlation id). Python-function events and the source's other arguments are not kept.

Alignment: Kineto writes ``ts`` in µs since ``baseTimeNanoseconds`` (Unix time), so an event's time on the
bundle's clock is ``base + ts - clock_anchor.unix_ns`` (the same rule as diagnose/normalize/trace.py). A trace
without ``baseTimeNanoseconds`` in a bundle is placed at its artifact's profiler window start and flagged;
a lone trace keeps its own clock (ts 0 = its earliest event).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagnose.export.chrome import TraceBuilder
from diagnose.trace.parse import RankTrace, read_trace

CAT_GPU = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


@dataclass
class ProfilerResult:
    files: int = 0
    gpu_events: int = 0
    cpu_events: int = 0
    flows: int = 0
    warnings: list[str] = field(default_factory=list)


def _ns(frame: pd.DataFrame, offset_ns: int) -> tuple[np.ndarray, np.ndarray]:
    ts = np.rint(frame["ts_us"].to_numpy(dtype=float) * 1000).astype(np.int64) + offset_ns
    dur = np.rint(frame["dur_us"].to_numpy(dtype=float) * 1000).astype(np.int64)
    return ts, ts + dur


def offset_ns(rt: RankTrace, anchor_unix_ns: int, entry: dict[str, Any] | None, anchor_mono_ns: int,
              warnings: list[str]) -> int:
    """What to add to a trace's ts (in ns) to put it on the bundle's clock."""
    base = rt.meta.get("baseTimeNanoseconds")
    if isinstance(base, int) and not isinstance(base, bool):
        return base - anchor_unix_ns
    start = (entry or {}).get("window_start_ns")
    first = min((float(f["ts_us"].min()) for f in (rt.gpu, rt.runtime, rt.cpu_ops, rt.annotations) if len(f)),
                default=0.0)
    if isinstance(start, int) and anchor_unix_ns:
        warnings.append(f"{rt.path.name}: no baseTimeNanoseconds; placed at the profiler window's start "
                        "(approximate alignment)")
        return (start - anchor_mono_ns) - int(round(first * 1000))
    return 0


def add_traces(tb: TraceBuilder, files: list[tuple[Path, dict[str, Any] | None]], *, anchor_unix_ns: int,
               anchor_mono_ns: int) -> ProfilerResult:
    res = ProfilerResult()
    for idx, (path, entry) in enumerate(files):
        rt = read_trace(path, rank=(entry or {}).get("rank") if isinstance((entry or {}).get("rank"), int) else None)
        res.files += 1
        res.warnings += rt.warnings
        off = offset_ns(rt, anchor_unix_ns, entry, anchor_mono_ns, res.warnings)
        _add_rank(tb, rt, off, res, idx)
    return res


def _add_rank(tb: TraceBuilder, rt: RankTrace, off: int, res: ProfilerResult, idx: int) -> None:
    r = rt.rank
    label = f"profiler rank {r}"
    names = ", ".join(str(n) for n in rt.meta.get("process_names") or [] if n and n != "None")
    cpu_pid = tb.process(f"prof:{r}:{rt.path.name}:cpu", f"{label} · host ({names or rt.path.name})", "profiler_cpu")
    stream_dev: dict[int, int] = {}
    kernel_at: dict[int, tuple[int, int, int]] = {}

    gpu = rt.gpu
    if len(gpu):
        start, end = _ns(gpu, off)
        names_g = gpu["name"].astype(str).to_numpy()
        kinds = gpu["kind"].astype(str).to_numpy()
        dev, stream, corr = (gpu[c].to_numpy() for c in ("device", "stream", "corr"))
        nbytes = gpu["bytes"].to_numpy()
        for i in range(len(gpu)):
            d, s = int(dev[i]), int(stream[i])
            stream_dev.setdefault(s, d)
            pid = tb.process(f"prof:{r}:{rt.path.name}:gpu{d}", f"{label} · GPU {d}", "profiler_gpu")
            tid = tb.thread(pid, f"stream{s}", f"stream {s}")
            args: dict[str, Any] = {"correlation": int(corr[i])}
            if nbytes[i] >= 0:
                args["bytes"] = int(nbytes[i])
            tb.slice(pid, tid, names_g[i], int(start[i]), int(end[i]), CAT_GPU.get(kinds[i], "kernel"), args,
                     exact=True)
            if corr[i] >= 0:
                kernel_at.setdefault(int(corr[i]), (pid, tid, int(start[i])))
        res.gpu_events += len(gpu)

    for frame, cat in ((rt.cpu_ops, "cpu_op"), (rt.runtime, "cuda_runtime")):
        if not len(frame):
            continue
        start, end = _ns(frame, off)
        nm = frame["name"].astype(str).to_numpy()
        tids = frame["tid"].to_numpy()
        corr = frame["corr"].to_numpy() if "corr" in frame else None
        for i in range(len(frame)):
            tid = tb.thread(cpu_pid, f"t{int(tids[i])}", f"thread {int(tids[i])}")
            cargs: dict[str, Any] | None = {"correlation": int(corr[i])} if corr is not None and corr[i] >= 0 else None
            tb.slice(cpu_pid, tid, nm[i], int(start[i]), int(end[i]), cat, cargs, exact=True)
            if corr is not None and corr[i] >= 0 and int(corr[i]) in kernel_at:
                tb.flow((cpu_pid, tid, int(start[i])), kernel_at.pop(int(corr[i])),
                        (idx << 40) | int(corr[i]), "launch", "ac2g")
                res.flows += 1
        res.cpu_events += len(frame)

    ann = rt.annotations
    if len(ann):
        start, end = _ns(ann, off)
        nm = ann["name"].astype(str).to_numpy()
        tids = ann["tid"].to_numpy()
        where = ann["where"].astype(str).to_numpy()
        for i in range(len(ann)):
            t = int(tids[i])
            if where[i] == "gpu":
                d = stream_dev.get(t, 0)
                pid = tb.process(f"prof:{r}:{rt.path.name}:gpu{d}", f"{label} · GPU {d}", "profiler_gpu")
                tid = tb.thread(pid, f"stream{t}", f"stream {t}")
                tb.slice(pid, tid, nm[i], int(start[i]), int(end[i]), "gpu_user_annotation", exact=True)
                res.gpu_events += 1
            else:
                tid = tb.thread(cpu_pid, f"t{t}", f"thread {t}")
                tb.slice(cpu_pid, tid, nm[i], int(start[i]), int(end[i]), "user_annotation", exact=True)
                res.cpu_events += 1
