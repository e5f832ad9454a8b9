"""Trace analysis speed and memory: diagnose vs a plain json.load vs HTA 0.5.0, side by side in one run.

Usage: python benchmarks/trace_bench.py [--reps 3] [--out benchmarks/results/trace_bench.md] [--compare]

Each measurement runs in a fresh subprocess (peak RSS from getrusage is per process), interleaved per
repetition so machine noise hits every tool alike; the table reports medians. HTA runs in its own venv
(~/.cache/diagnose/hta-venv: holistictraceanalysis==0.5.0 with pandas<3), built here when missing.
--compare also writes benchmarks/results/trace_compare.md: GPU busy/idle/compute/non-compute shares and
comm-compute overlap from HTA next to diagnose's, per trace.

This file imports only the standard library at top level: the HTA venv runs it as a worker too.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path("/work/shared/traces")
HTA_VENV = Path.home() / ".cache" / "diagnose" / "hta-venv"
TRACES = [  # (label, path, rank) - the largest AMD trace, the largest NVIDIA traces, the H100 LLM trace
    ("mi300x_xdit_sd3.5 (AMD, 239k events)", SHARED / "tracelens/mi300x_xdit_sd3.5_largest_239k_events.json.gz", 0),
    ("v100_2rank_nccl (NVIDIA, 216k events)", SHARED / "hta/v100_2rank_nccl_df_index_resolver.json.gz", 1),
    ("a100_8rank_rank3 (NVIDIA, 109k events)", SHARED / "hta/trace_diff_control_a100_8rank_rank3.json.gz", 3),
    ("a100_16rank_cudagraph (NVIDIA, 109k events)", SHARED / "hta/a100_16rank_nccl_cudagraph_rank0.json.gz", 0),
    ("h100_qwen0.5b (NVIDIA, 18k events)", SHARED / "tracelens/h100_single_gpu_qwen1.5_0.5b_chat.json.gz", 0),
]


def _cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime + c.ru_utime + c.ru_stime


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def worker(mode: str, path: str, rank: int) -> dict[str, object]:
    """One measurement in this process. Imports happen before the clock starts."""
    out: dict[str, object] = {}
    if mode == "json":
        base = _rss_mb()
        c, t = _cpu_s(), time.perf_counter()
        with open(path, "rb") as fh:
            data = json.load(fh)
        out["seconds"], out["cpu"] = time.perf_counter() - t, _cpu_s() - c
        out["events"] = len(data.get("traceEvents", []))
    elif mode == "diagnose":
        sys.path.insert(0, str(ROOT))
        from diagnose.trace import analyze_trace

        base = _rss_mb()
        c, t = _cpu_s(), time.perf_counter()
        a = analyze_trace(path)
        out["seconds"], out["cpu"] = time.perf_counter() - t, _cpu_s() - c
        out["rss_mb"] = _rss_mb()  # before the comparison extras below
        g = a.tables["trace_gpu_time"]
        if not g.empty and os.environ.get("BENCH_COMPARE"):
            out["shares"] = _shares(g.iloc[0])
            out["shares_trim"] = _hta_trimmed_shares(path)
    elif mode == "hta":
        import logging

        logging.disable(logging.WARNING)
        from hta.trace_analysis import TraceAnalysis

        base = _rss_mb()
        c, t = _cpu_s(), time.perf_counter()
        ta = TraceAnalysis(trace_files={rank: path}, trace_dir=str(Path(path).parent))
        out["seconds"], out["cpu"] = time.perf_counter() - t, _cpu_s() - c
        if os.environ.get("BENCH_COMPARE"):
            try:
                tb = ta.get_temporal_breakdown(visualize=False)
            except Exception as e:  # noqa: BLE001 - HTA asserts on some traces; record it
                out["shares_error"] = f"{type(e).__name__} in get_temporal_breakdown"
                out["rss_mb"], out["rss_base_mb"] = _rss_mb(), base
                return out
            r = tb.iloc[0]
            window = float(r["idle_time(us)"] + r["compute_time(us)"] + r["non_compute_time(us)"])
            shares = {"busy": 1 - r["idle_time_pctg"] / 100, "idle": r["idle_time_pctg"] / 100,
                      "compute": r["compute_time_pctg"] / 100, "non_compute": r["non_compute_time_pctg"] / 100,
                      "window_us": window}
            try:
                ov = ta.get_comm_comp_overlap(visualize=False)
                shares["comm_overlap"] = float(ov.iloc[0]["comp_comm_overlap_pctg"]) / 100
            except Exception as e:  # noqa: BLE001 - HTA fails on traces without communication
                shares["comm_overlap_error"] = str(e)[:80]
            out["shares"] = shares
    else:
        raise SystemExit(f"unknown mode {mode}")
    out.setdefault("rss_mb", _rss_mb())
    out["rss_base_mb"] = base
    return out


def _shares(r: object) -> dict[str, float]:
    g = r  # a row of trace_gpu_time
    return {"busy": g["busy_ratio"], "idle": g["idle_ratio"], "compute": g["compute_ratio"],  # type: ignore[index]
            "non_compute": (g["busy_us"] - g["compute_us"]) / g["window_us"],  # type: ignore[index]
            "comm_overlap": g["comm_overlap_ratio"]}  # type: ignore[index]


def _hta_trimmed_shares(path: str) -> dict[str, float] | None:
    """Our shares after HTA's iteration trimming: with >= 2 ProfilerSteps, keep only kernels launched inside
    the ProfilerSteps but the last (HTA's default ``include_last_profiler_step=False``)."""
    import numpy as np

    from diagnose.trace.classify import classify_kernels
    from diagnose.trace.parse import read_trace
    from diagnose.trace.timeline import gpu_time, launch_start_for

    rt = read_trace(path)
    ann = rt.annotations
    steps = ann[(ann["where"] == "cpu") & ann["name"].astype(str).str.startswith("ProfilerStep")].sort_values("ts_us")
    if len(steps) < 2:
        return None
    lt = launch_start_for(rt.gpu, rt.runtime)
    keep = np.zeros(len(rt.gpu), dtype=bool)
    for ts, dur in zip(steps["ts_us"].iloc[:-1], steps["dur_us"].iloc[:-1], strict=True):
        keep |= (lt >= ts) & (lt <= ts + dur)
    g = rt.gpu[keep].reset_index(drop=True)
    row, _ = gpu_time(g, classify_kernels(g), rt.rank)
    return _shares(row)


def ensure_hta() -> Path:
    py = HTA_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "holistictraceanalysis==0.5.0", "pandas<3"],
                       check=True)
    return py


def run_one(python: str, mode: str, path: Path, rank: int, env: dict[str, str]) -> dict[str, object]:
    cmd = [python, str(Path(__file__).resolve()), "--worker", mode, str(path), str(rank)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if res.returncode != 0:
        return {"error": (res.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=3, metavar=("MODE", "PATH", "RANK"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/trace_bench.md"))
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--only", default="", help="substring of the trace labels to run")
    ap.add_argument("--scale-mb", type=int, default=0,
                    help="instead: write a synthetic trace of about this many raw MB and measure peak memory")
    args = ap.parse_args()
    if args.worker:
        mode, path, rank = args.worker
        print(json.dumps(worker(mode, path, int(rank)), default=float))
        return
    if args.scale_mb:
        scale(args.scale_mb, Path(args.out).with_name("trace_scale.md"))
        return
    hta_py = str(ensure_hta())
    env = dict(os.environ, PYTHONHASHSEED="0")
    if args.compare:
        env["BENCH_COMPARE"] = "1"
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="trace_bench_"))
    try:
        for label, path, rank in TRACES:
            if args.only and args.only not in label:
                continue
            raw = tmp / (path.name.removesuffix(".gz"))
            with gzip.open(path, "rb") as src, open(raw, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            res: dict[str, list[dict[str, object]]] = {"json": [], "diagnose": [], "hta": []}
            for _ in range(args.reps):
                res["json"].append(run_one(sys.executable, "json", raw, rank, env))
                res["diagnose"].append(run_one(sys.executable, "diagnose", path, rank, env))
                res["hta"].append(run_one(hta_py, "hta", path, rank, env))
            rows.append((label, path, raw.stat().st_size, res))
            raw.unlink()
            print(label, {k: [round(float(r.get("cpu", -1)), 3) for r in v] for k, v in res.items()},
                  flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_report(rows, Path(args.out), args.reps)
    if args.compare:
        write_compare(rows, Path(args.out).with_name("trace_compare.md"))


def write_synthetic(path: Path, raw_mb: int) -> int:
    """A gzip Kineto-style trace: per step 1 annotation, 40 runtime calls + kernels, 40 cpu ops, 120
    python_function events (most of the bytes, as in with_stack traces). Returns the number of events."""
    import random

    rnd = random.Random(0)
    n = 0
    written = 0
    t = 1_000_000.0
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b'{"schemaVersion": 1, "traceEvents": [\n')
        first = True
        while written < raw_mb * 1_000_000:
            evs = [{"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_8(8)", "pid": 1,
                    "tid": 1, "ts": t, "dur": 900.0}]
            for i in range(40):
                c = n + i
                evs.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 13}", "pid": 1, "tid": 1,
                            "ts": t + i * 20, "dur": 15.0, "args": {"External id": c, "Input Dims": [[8, 4096]]}})
                evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                            "ts": t + i * 20 + 5, "dur": 4.0, "args": {"correlation": c}})
                evs.append({"ph": "X", "cat": "kernel", "name": f"void kernel_{i % 17}<float>(float*)", "pid": 0,
                            "tid": 7, "ts": t + i * 20 + 12, "dur": rnd.uniform(2, 30),
                            "args": {"device": 0, "stream": 7, "correlation": c, "grid": [64, 1, 1]}})
            for i in range(120):
                evs.append({"ph": "X", "cat": "python_function", "name": f"vllm/worker/model_runner.py({i}): f{i}",
                            "pid": 1, "tid": 1, "ts": t + i * 7, "dur": 5.0,
                            "args": {"Python parent id": i, "Python id": i + 1, "Ev Idx": n + i}})
            data = b",\n".join(json.dumps(e).encode() for e in evs)
            fh.write(data if first else b",\n" + data)
            first = False
            written += len(data)
            n += len(evs)
            t += 1000.0
        fh.write(b'\n], "traceName": "synthetic"}\n')
    return n


def scale(raw_mb: int, out: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="trace_scale_"))
    try:
        p = tmp / "synthetic.json.gz"
        n = write_synthetic(p, raw_mb)
        d = run_one(sys.executable, "diagnose", p, 0, dict(os.environ))
        lines = [f"# Bounded memory on a large trace ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
                 f"`python benchmarks/trace_bench.py --scale-mb {raw_mb}` writes a synthetic Kineto-style trace "
                 f"({raw_mb} MB raw, {p.stat().st_size / 1e6:.0f} MB gzip, {n:,} events of which 60 % "
                 "python_function, as in with_stack serving traces) and runs the full analysis on it.", "",
                 "| raw MB | events | diagnose CPU s | wall s | peak RSS MB | growth over imports MB |",
                 "|---|---|---|---|---|---|",
                 f"| {raw_mb} | {n:,} | {d.get('cpu', float('nan')):.1f} | {d.get('seconds', float('nan')):.1f} | "
                 f"{d.get('rss_mb', float('nan')):.0f} | {d.get('rss_mb', 0) - d.get('rss_base_mb', 0):.0f} |", "",
                 "For scale: a plain `json.load` of the 62 MB xDiT trace grows the process by about 350 MB "
                 "(5-6 bytes of Python objects per byte of JSON, measured with the json worker of this script), so "
                 f"this file would need roughly {raw_mb * 5.6 / 1000:.1f} GB as Python objects; HTA's default load "
                 "needs more (its DataFrame on top of the objects)."]
        out.write_text("\n".join(lines) + "\n")
        print("\n".join(lines), d.get("error", ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _med(rs: list[dict[str, object]], key: str) -> float:
    vals = [float(r[key]) for r in rs if key in r]  # type: ignore[arg-type]
    return statistics.median(vals) if vals else float("nan")


def write_report(rows: list, out: Path, reps: int) -> None:  # type: ignore[type-arg]
    lines = [
        "# Trace analysis: diagnose vs json.load vs HTA 0.5.0", "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python benchmarks/trace_bench.py "
        f"--reps {reps}` on this 2-core machine (shared with other work: absolute times are noisy, the ratios "
        "come from interleaved runs). Median of the repetitions; each run is a fresh process.", "",
        "- **diagnose**: `analyze_trace(file.json.gz)`: streaming gunzip + parse + every analysis (GPU time, idle "
        "attribution, kernel classes, launch stats, syncs/transfers, steps, multi-rank, signals, sections).",
        "- **json.load**: `json.load` of the already decompressed file (no analysis at all).",
        "- **HTA**: `TraceAnalysis(trace_files={rank: file.json.gz})`, the default JSON backend (load only, no "
        "analysis), holistictraceanalysis 0.5.0 + pandas 2.3 in its own venv.",
        "- Peak RSS is the whole process (interpreter and imports included); `+` is the growth over the RSS "
        "after imports.",
        "- CPU s = user + system time of the process and its children (robust to other load on the machine); "
        "wall s = elapsed time. Ratios are given for both.", "",
        "| trace | raw MB | json.load CPU s (wall) | diagnose CPU s (wall) | HTA load CPU s (wall) | "
        "diagnose / json.load CPU (wall) | diagnose / HTA CPU (wall) | peak RSS diagnose MB | peak RSS HTA MB | "
        "RSS ratio | peak RSS json.load MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, _path, size, res in rows:
        j, d, h = (_med(res[k], "seconds") for k in ("json", "diagnose", "hta"))
        jc, dc, hc = (_med(res[k], "cpu") for k in ("json", "diagnose", "hta"))
        rd, rh = _med(res["diagnose"], "rss_mb"), _med(res["hta"], "rss_mb")
        bd = rd - _med(res["diagnose"], "rss_base_mb")
        bh = rh - _med(res["hta"], "rss_base_mb")
        err = "; ".join(str(r["error"]) for v in res.values() for r in v if "error" in r)
        lines.append(f"| {label} | {size / 1e6:.1f} | {jc:.2f} ({j:.2f}) | {dc:.2f} ({d:.2f}) | {hc:.2f} ({h:.2f}) | "
                     f"{dc / jc:.2f} ({d / j:.2f}) | {dc / hc:.2f} ({d / h:.2f}) | "
                     f"{rd:.0f} (+{bd:.0f}) | {rh:.0f} (+{bh:.0f}) | {rd / rh:.2f} | {_med(res['json'], 'rss_mb'):.0f} |"
                     + (f" error: {err}" if err
                                                                                        else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def write_compare(rows: list, out: Path) -> None:  # type: ignore[type-arg]
    lines = ["# GPU time shares: diagnose vs HTA 0.5.0 temporal breakdown", "",
             f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python benchmarks/trace_bench.py "
             "--compare`. Percent of the rank's window. diagnose's window is first to last GPU activity of the "
             "whole trace; HTA (default `include_last_profiler_step=False`) first trims a trace with >= 2 "
             "ProfilerSteps to the kernels launched inside the steps but the last. The `diagnose, HTA trim` "
             "column applies that same trim to diagnose's tables: it isolates the window definition from the "
             "interval arithmetic. non-compute = busy - compute. comm_overlap = share of communication time "
             "under compute. Differences in percentage points (pp).", "",
             "| trace | metric | HTA % | diagnose % | diff pp | diagnose, HTA trim % | diff pp |",
             "|---|---|---|---|---|---|---|"]
    for label, _path, _size, res in rows:
        h = next((r.get("shares") for r in res["hta"] if r.get("shares")), None)
        d = next((r.get("shares") for r in res["diagnose"] if r.get("shares")), None)
        dt = next((r.get("shares_trim") for r in res["diagnose"] if r.get("shares_trim")), None)
        if not h or not d:
            err = next((r.get("shares_error") for r in res["hta"] if r.get("shares_error")), "no result")
            lines.append(f"| {label} | (HTA: {err}) | | | | | |")
            continue
        for k in ("busy", "idle", "compute", "non_compute", "comm_overlap"):
            if k in h and k in d and d[k] == d[k]:
                hv, dv = 100 * float(h[k]), 100 * float(d[k])
                tv = f"{100 * float(dt[k]):.2f} | {100 * float(dt[k]) - hv:+.2f}" if dt else "n/a (< 2 ProfilerSteps) |"
                lines.append(f"| {label} | {k} | {hv:.2f} | {dv:.2f} | {dv - hv:+.2f} | {tv} |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
