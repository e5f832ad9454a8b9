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

import numpy as np
import pandas as pd

from diagnose.export.chrome import TraceBuilder, lanes
from diagnose.io.manifest import Artifact
from diagnose.trace.parse import RankTrace, read_trace

CAT_GPU = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


@dataclass
class ProfilerResult:
    files: int = 0
    gpu_events: int = 0
    cpu_events: int = 0
    flows: int = 0
    overlap_tracks: int = 0  # extra tracks for events that partly overlap others on their source track
    warnings: list[str] = field(default_factory=list)


def _ns(frame: pd.DataFrame, offset_ns: int) -> tuple[np.ndarray, np.ndarray]:
    ts = np.rint(frame["ts_us"].to_numpy(dtype=float) * 1000).astype(np.int64) + offset_ns
    dur = np.rint(frame["dur_us"].to_numpy(dtype=float) * 1000).astype(np.int64)
    return ts, ts + dur


def offset_ns(rt: RankTrace, anchor_unix_ns: int, entry: Artifact | None, anchor_mono_ns: int,
              warnings: list[str]) -> int:
    """What to add to a trace's ts (in ns) to put it on the bundle's clock."""
    base = rt.meta.get("baseTimeNanoseconds")
    if isinstance(base, int) and not isinstance(base, bool):
        return base - anchor_unix_ns
    start = entry.window_start_ns if entry is not None else None
    first = min((float(f["ts_us"].min()) for f in (rt.gpu, rt.runtime, rt.cpu_ops, rt.annotations) if len(f)),
                default=0.0)
    if isinstance(start, int) and anchor_unix_ns:
        warnings.append(f"{rt.path.name}: no baseTimeNanoseconds; placed at the profiler window's start "
                        "(approximate alignment)")
        return (start - anchor_mono_ns) - int(round(first * 1000))
    return 0


def add_traces(tb: TraceBuilder, files: list[tuple[Path, Artifact | None]], *, anchor_unix_ns: int,
               anchor_mono_ns: int) -> ProfilerResult:
    res = ProfilerResult()
    for idx, (path, entry) in enumerate(files):
        rt = read_trace(path, rank=entry.rank if entry is not None else None)
        res.files += 1
        res.warnings += rt.warnings
        off = offset_ns(rt, anchor_unix_ns, entry, anchor_mono_ns, res.warnings)
        _add_rank(tb, rt, off, res, idx)
    return res


@dataclass
class _Track:
    """One source track (a GPU stream, a host thread) before it is split into nested lanes."""

    pid: int
    key: str
    name: str
    events: list[tuple[str, int, int, str, dict[str, int] | None, int]] = field(default_factory=list)
    # (name, start ns, end ns, category, args, correlation id or -1)


def _emit(tb: TraceBuilder, tr: _Track, res: ProfilerResult) -> dict[int, tuple[int, int, int]]:
    """Write a track's events; events that partly overlap others (a clock glitch in the source) go to extra
    tracks ``<name> (overlap N)`` so each track nests. Returns {correlation: (pid, tid, start)}."""
    lane = lanes([(a, b) for _, a, b, _, _, _ in tr.events])
    tids: dict[int, int] = {}
    at: dict[int, tuple[int, int, int]] = {}
    for (name, a, b, cat, args, corr), ln in zip(tr.events, lane, strict=True):
        tid = tids.get(ln)
        if tid is None:
            tid = tids[ln] = tb.thread(tr.pid, f"{tr.key}:{ln}", tr.name if ln == 0 else f"{tr.name} (overlap {ln})")
        tb.slice(tr.pid, tid, name, a, b, cat, args, exact=True)
        if corr >= 0:
            at.setdefault(corr, (tr.pid, tid, a))
    res.overlap_tracks += len(tids) - 1 if tids else 0
    return at


def _add_rank(tb: TraceBuilder, rt: RankTrace, off: int, res: ProfilerResult, idx: int) -> None:
    r = rt.rank
    label = f"profiler rank {r}"
    names = ", ".join(str(n) for n in rt.meta.get("process_names") or [] if n and n != "None")
    cpu_pid = tb.process(f"prof:{idx}:cpu", f"{label} · host ({names or rt.path.name})", "profiler_cpu")
    tracks: dict[tuple[int, str], _Track] = {}

    def gpu_track(d: int, s: int) -> _Track:
        key = (d, f"stream{s}")
        if key not in tracks:
            pid = tb.process(f"prof:{idx}:gpu{d}", f"{label} · GPU {d}", "profiler_gpu")
            tracks[key] = _Track(pid, f"stream{s}", f"stream {s}")
        return tracks[key]

    def cpu_track(t: int) -> _Track:
        key = (-1, f"t{t}")
        if key not in tracks:
            tracks[key] = _Track(cpu_pid, f"t{t}", f"thread {t}")
        return tracks[key]

    stream_dev: dict[int, int] = {}
    gpu = rt.gpu
    if len(gpu):
        start, end = _ns(gpu, off)
        names_g = gpu["name"].astype(str).to_numpy()
        kinds = gpu["kind"].astype(str).to_numpy()
        dev, stream, corr = (gpu[c].to_numpy() for c in ("device", "stream", "corr"))
        nbytes = gpu["bytes"].to_numpy()
        for i in range(len(gpu)):
            d, st = int(dev[i]), int(stream[i])
            stream_dev.setdefault(st, d)
            args = {"correlation": int(corr[i])}
            if nbytes[i] >= 0:
                args["bytes"] = int(nbytes[i])
            gpu_track(d, st).events.append((names_g[i], int(start[i]), int(end[i]), CAT_GPU.get(kinds[i], "kernel"),
                                            args, int(corr[i])))
        res.gpu_events += len(gpu)
    for frame, cat in ((rt.cpu_ops, "cpu_op"), (rt.runtime, "cuda_runtime")):
        if not len(frame):
            continue
        start, end = _ns(frame, off)
        nm = frame["name"].astype(str).to_numpy()
        tids = frame["tid"].to_numpy()
        corr = frame["corr"].to_numpy() if "corr" in frame else None
        for i in range(len(frame)):
            tr = cpu_track(int(tids[i]))
            c = int(corr[i]) if corr is not None else -1
            tr.events.append((nm[i], int(start[i]), int(end[i]), cat, {"correlation": c} if c >= 0 else None, c))
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
                gpu_track(stream_dev.get(t, 0), t).events.append((nm[i], int(start[i]), int(end[i]),
                                                                  "gpu_user_annotation", None, -1))
                res.gpu_events += 1
            else:
                cpu_track(t).events.append((nm[i], int(start[i]), int(end[i]), "user_annotation", None, -1))
                res.cpu_events += 1
    kernel_at: dict[int, tuple[int, int, int]] = {}
    launch_at: dict[int, tuple[int, int, int]] = {}
    for (d, _), tr in sorted(tracks.items(), key=lambda kv: (kv[0][0] >= 0, kv[0])):  # host threads first
        into = kernel_at if d >= 0 else launch_at
        for c, where in _emit(tb, tr, res).items():
            into.setdefault(c, where)
    for c, src in launch_at.items():
        dst = kernel_at.get(c)
        if dst is not None:
            tb.flow(src, dst, (idx << 40) | c, "launch", "ac2g")
            res.flows += 1
