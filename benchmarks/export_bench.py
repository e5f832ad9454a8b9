"""Export cost as a user sees it: `diagnose export` in each format vs `diagnose analyze` of the same input
(what the user already runs on it), as ratios in one run.

Usage: python benchmarks/export_bench.py [--reps 3] [--out benchmarks/results/export_bench.md]

Every measurement is a fresh process of this environment's `diagnose` console script. Per repetition the
arms run back to back, their order rotating, so load from other work on the machine falls on all of them.
Wall time from the clock, CPU time (user + system) and peak RSS from os.wait4 of the child. Medians, with
the min-max spread. Inputs: the largest sample bundle, the sample with a profiler trace, and the largest
shared trace (mi300x xDiT, 239k events) when /work/shared/traces is present.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIAGNOSE = str(Path(sys.executable).with_name("diagnose"))
XDIT = Path("/work/shared/traces/tracelens/mi300x_xdit_sd3.5_largest_239k_events.json.gz")


def inputs() -> list[Path]:
    samples = [p for p in (ROOT / "sample_traces").iterdir() if (p / "bundle" / "manifest.json").exists()]
    biggest = max(samples, key=lambda p: sum(f.stat().st_size for f in (p / "bundle").rglob("*") if f.is_file()))
    out = [biggest, ROOT / "sample_traces" / "h200_toy_idle_between_steps"]
    if XDIT.exists():
        out.append(XDIT)
    return out


def run(args: list[str]) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    p = subprocess.Popen([DIAGNOSE, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode not in (0, 5):  # 5: analyze of an invalid run still wrote its report
        raise SystemExit(f"diagnose {' '.join(args)} failed ({p.returncode}): {p.stderr.read().decode() if p.stderr else ''}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def arms(src: Path, tmp: Path) -> dict[str, list[str]]:
    out = {"analyze": ["analyze", str(src), "-q", "-o", str(tmp / "r.html")],
           "perfetto": ["export", str(src), "-q", "-f", "perfetto", "-o", str(tmp / "t.json")],
           "parquet": ["export", str(src), "-q", "-f", "parquet", "-o", str(tmp / "tables")]}
    if src.is_dir():
        out["speedscope"] = ["export", str(src), "-q", "-f", "speedscope", "-o", str(tmp / "s.json")]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "export_bench.md")
    a = ap.parse_args()
    lines = ["# Export cost (benchmarks/export_bench.py)", "",
             f"{a.reps} repetitions per arm, fresh processes, order rotating; medians (min-max). Ratio: the "
             "export's wall time over `diagnose analyze` of the same input in the same run.", "",
             "| input | arm | wall s | CPU s | peak RSS MiB | wall / analyze | output |", "|---|---|---|---|---|---|---|"]
    for src in inputs():
        tmp = Path(tempfile.mkdtemp(prefix="export_bench."))
        try:
            cmds = arms(src, tmp)
            res: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cmds}
            names = list(cmds)
            for rep in range(a.reps):
                for k in names[rep % len(names):] + names[: rep % len(names)]:
                    res[k].append(run(cmds[k]))
            sizes = {"analyze": tmp / "r.html", "perfetto": tmp / "t.json", "speedscope": tmp / "s.json",
                     "parquet": tmp / "tables"}
            base = statistics.median(w for w, _, _ in res["analyze"])
            for k, vals in res.items():
                w = [v[0] for v in vals]
                c = [v[1] for v in vals]
                m = [v[2] for v in vals]
                p = sizes[k]
                size = sum(f.stat().st_size for f in p.rglob("*")) if p.is_dir() else p.stat().st_size
                lines.append(f"| {src.name} | {k} | {statistics.median(w):.2f} ({min(w):.2f}-{max(w):.2f}) | "
                             f"{statistics.median(c):.2f} | {statistics.median(m):.0f} | "
                             f"{statistics.median(w) / base:.2f} | {size / 1e6:.2f} MB |")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    lines += ["", f"Machine: {os.cpu_count()} cores, shared with other jobs (load average "
              f"{os.getloadavg()[0]:.1f} at the end of the run)."]
    a.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
