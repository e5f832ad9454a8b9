"""Scale-out trace analysis: single process vs Dask (diagnose/trace/distributed.py), side by side in one run.

Synthetic rank sets of 8, 64 and 256 ranks are built from real traces (tests/trace/rankset.py: each rank a
copy of the source rank shifted by 3 µs x (rank mod 7), one rank delayed by 5 ms), in a temporary directory.
For each set:

- **single**: ``analyze_trace(dir)`` in a fresh process (one rank at a time): wall time and the process's peak
  RSS (VmHWM);
- **dask**: the same in a fresh client process against a LocalCluster of ``--workers`` worker processes (one
  thread each), a fresh cluster per set so that each worker's peak RSS (VmHWM, reported by the
  tasks) is that set's; its start-up and the workers' imports are done before the clock starts, as on a
  running cluster (the start-up is reported apart); the client process's own peak RSS is the merge's;
- **identical**: the two results (every table but ``analysis_s``, the warnings, the signals) compared.

Then a projection to 1,000 ranks: wall time from a least-squares line over the measured sizes (per path),
peak memory per worker as measured (it does not grow with the set), the merge's memory from the per-rank
growth of the client's RSS.

    python benchmarks/trace_ranks_dask.py [--workers 2] [--write benchmarks/results/trace_ranks_dask.md]
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARED = Path("/work/shared/traces/hta")
SOURCES = [  # (label, trace, set sizes)
    ("sampled_128rank rank 0 (HTA, 4.9k events, 10 NCCL kernels)",
     ROOT / "tests/data/traces/sampled_128rank/sampled_128rank_rank0.json.gz", (8, 64, 256)),
    ("a100_16rank_nccl_cudagraph rank 0 (HTA, 109k events, 80 NCCL kernels)",
     SHARED / "a100_16rank_nccl_cudagraph_rank0.json.gz", (8, 64)),
]
CHILD = """
import pickle, sys, time
from diagnose.trace import analyze_trace
from diagnose.trace.distributed import ScaleOut, peak_rss_bytes, scale_out
import distributed, pyarrow.parquet  # imported before the clock starts, in both modes
def main():
    d, out, sched = sys.argv[1], sys.argv[2], sys.argv[3]
    t0 = time.perf_counter()
    if sched == "-":
        a = analyze_trace(d)
    else:
        with scale_out(ScaleOut(scheduler=sched)):
            a = analyze_trace(d)
    wall = time.perf_counter() - t0
    t = dict(a.tables)
    t["trace_summary"] = t["trace_summary"].drop(columns=["analysis_s"])
    res = {"wall_s": wall, "peak_rss_bytes": peak_rss_bytes(),
           "scale_out": a.summary.get("scale_out"), "tables": t, "warnings": a.warnings,
           "signals": [(s.name, s.value, s.unit) for s in a.signals], "ranks": len(a.summary["ranks"])}
    with open(out, "wb") as f:
        pickle.dump(res, f)
if __name__ == "__main__":
    main()
"""


def warm() -> None:
    import pyarrow.parquet  # noqa: F401

    import diagnose.trace.distributed  # noqa: F401
    import diagnose.trace.multirank  # noqa: F401


def run_child(d: Path, out: Path, scheduler: str | None) -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-c", CHILD, str(d), str(out), scheduler or "-"], capture_output=True,
                       text=True, cwd=str(ROOT), timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"child failed on {d}: {p.stderr[-2000:]}")
    with out.open("rb") as f:
        res: dict[str, Any] = pickle.load(f)
    return res


def identical(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import pandas as pd

    if sorted(a["tables"]) != sorted(b["tables"]) or a["warnings"] != b["warnings"] or a["signals"] != b["signals"]:
        return False
    for k in a["tables"]:
        try:
            pd.testing.assert_frame_equal(a["tables"][k], b["tables"][k])
        except AssertionError:
            return False
    return True


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    import numpy as np

    slope, icpt = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(slope), float(icpt)


def mb(b: float) -> str:
    return f"{b / 2**20:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--write", type=Path, help="write the Markdown results here")
    ap.add_argument("--quick", action="store_true", help="a smoke run: the small source at 8 ranks only")
    args = ap.parse_args()
    sources = [(SOURCES[0][0], SOURCES[0][1], (8,))] if args.quick else SOURCES

    import dask.config
    from distributed import Client, LocalCluster

    from diagnose.trace.distributed import NO_HTTP_PORT
    from tests.trace.rankset import write_rank_set

    rows: list[dict[str, Any]] = []
    startups: list[float] = []
    with tempfile.TemporaryDirectory(prefix="diagnose-rankset-") as tmp_s:
        tmp = Path(tmp_s)
        for label, src, sizes in sources:
            if not src.is_file():
                print(f"skipped {label}: {src} not found", file=sys.stderr)
                continue
            for n in sizes:
                d = tmp / f"{src.name}-{n}"
                tg = time.perf_counter()
                write_rank_set(src, d, n, delayed=n // 2 + 1)
                gen = time.perf_counter() - tg
                single = run_child(d, tmp / "single.pkl", None)
                t0 = time.perf_counter()  # a fresh cluster per set: each worker's peak RSS is this set's
                with dask.config.set({"distributed.worker.profile.enabled": False}), \
                        LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                  dashboard_address=None, silence_logs=logging.ERROR,
                                  scheduler_kwargs=dict(NO_HTTP_PORT)) as cluster, Client(cluster) as client:
                    client.wait_for_workers(args.workers, timeout=300)
                    client.run(warm)  # ... and warm, as on a running cluster (imports done)
                    startups.append(time.perf_counter() - t0)
                    dres = run_child(d, tmp / "dask.pkl", cluster.scheduler_address)
                so = dres["scale_out"]
                if so["workers"] != args.workers:
                    raise SystemExit(f"{so['workers']} of {args.workers} workers ran the {n}-rank set")
                row = {"source": label, "ranks": n, "raw_mb": sum(f.stat().st_size for f in d.iterdir()) / 2**20,
                       "gen_s": gen, "single_s": single["wall_s"], "single_rss": single["peak_rss_bytes"],
                       "dask_s": dres["wall_s"], "client_rss": dres["peak_rss_bytes"],
                       "worker_rss": so["worker_peak_rss_bytes"], "workers": so["workers"],
                       "identical": identical(single, dres), "analysed": single["ranks"]}
                rows.append(row)
                print(json.dumps(row, default=str), flush=True)
                for f in d.iterdir():
                    f.unlink()
                d.rmdir()
        startup = sum(startups) / max(len(startups), 1)
        md = report(rows, startup, args.workers)
    print(md)
    if args.write:
        args.write.write_text(md)


def report(rows: list[dict[str, Any]], startup: float, workers: int) -> str:
    import os

    out = [
        "# Scale-out trace analysis: single process vs Dask",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python benchmarks/trace_ranks_dask.py "
        f"--workers {workers} --write benchmarks/results/trace_ranks_dask.md`, on a machine with "
        f"{os.cpu_count()} cores shared with other jobs (load average at the end: "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}).",
        "",
        "Rank sets built from real traces (tests/trace/rankset.py: copies of the rank shifted by 3 µs × (rank mod 7), "
        "rank n/2+1 delayed by 5 ms; gzip level 1). **single**: `analyze_trace(dir)` in a fresh process, one rank "
        "at a time. **dask**: the same call in a fresh client process with `ScaleOut(scheduler=...)` against a "
        f"LocalCluster of {workers} worker processes (1 thread each; a fresh cluster per set, so that each worker's peak is that set's; its start-up, "
        f"{startup:.1f} s on average, and the workers' imports are done before the clock starts, as on a running "
        "cluster). Wall times exclude "
        "the client's imports. Peak memory = VmHWM of the process (for the workers: reported by each "
        "worker's tasks, so the worker's peak over the set; not `ru_maxrss`, which on Linux also counts the RSS "
        "of the forking parent before the exec). **identical** = every table (but "
        "`analysis_s`), warning and signal equal.",
        "",
        "| source rank | ranks | raw gz MB | single s | dask s | single / dask | single peak MB | dask peak MB per "
        "worker | dask client peak MB | identical |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {r['source']} | {r['ranks']} | {r['raw_mb']:.0f} | {r['single_s']:.1f} | {r['dask_s']:.1f} | "
                   f"{r['single_s'] / r['dask_s']:.2f} | {mb(r['single_rss'])} | "
                   f"{' / '.join(mb(x) for x in r['worker_rss'])} | {mb(r['client_rss'])} | "
                   f"{'yes' if r['identical'] else '**NO**'} |")
    out += ["", "## Projection to 1,000 ranks", "",
            "Wall time: least-squares line over the measured set sizes (per path); per-worker memory: the largest "
            "measured (it depends on the largest rank, not on the number of ranks); client memory: its measured "
            "per-rank growth extended linearly (the merged per-rank tables it holds).", "",
            "| source rank | single s | dask s | dask s per rank | dask peak MB per worker | dask client peak MB |",
            "|---|---|---|---|---|---|"]
    for label in dict.fromkeys(r["source"] for r in rows):
        rs = [r for r in rows if r["source"] == label]
        if len(rs) < 2:
            continue
        n = [float(r["ranks"]) for r in rs]
        s1, i1 = fit(n, [r["single_s"] for r in rs])
        s2, i2 = fit(n, [r["dask_s"] for r in rs])
        sc, ic = fit(n, [r["client_rss"] for r in rs])
        worker = max(max(r["worker_rss"]) for r in rs)
        out.append(f"| {label} | {s1 * 1000 + i1:.0f} | {s2 * 1000 + i2:.0f} | {s2:.3f} | {mb(worker)} | "
                   f"{mb(sc * 1000 + ic)} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
