"""Cost of the host probe's scan of every process (probes/host_procs.py read_all_processes, used by
ForeignCpu every 5 s) against the psutil way of reading the same fields (name, ppid, CPU times, last core),
in one run on this machine. Writes benchmarks/results/host_foreign_scan.md.

    .venv/bin/python benchmarks/host_foreign_scan.py --repeat 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from diagnose.probes.host_procs import read_all_processes  # noqa: E402


def with_psutil() -> dict[int, Any]:
    return {p.pid: p.info for p in psutil.process_iter(["name", "ppid", "cpu_times", "cpu_num"])}


def cost(fn: Callable[[], dict[int, Any]], repeat: int) -> tuple[float, float, int]:
    """Median wall ms and CPU ms per call, and the processes seen."""
    fn()  # warm (psutil caches its Process objects)
    walls, cpus, n = [], [], 0
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        n = len(fn())
        walls.append((time.perf_counter() - w) * 1e3)
        cpus.append((time.process_time() - c) * 1e3)
    return statistics.median(walls), statistics.median(cpus), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "host_foreign_scan.md")
    a = ap.parse_args()
    rows = []
    for _ in range(3):  # alternate, so drift on a shared machine hits both
        rows.append((cost(read_all_processes, a.repeat), cost(with_psutil, a.repeat)))
    own = statistics.median(r[0][1] for r in rows)
    ps = statistics.median(r[1][1] for r in rows)
    n = rows[-1][0][2]
    text = [
        "# Host probe: cost of scanning every process for the busiest ones outside the engine", "",
        f"Command: `.venv/bin/python benchmarks/host_foreign_scan.py --repeat {a.repeat}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, {n} processes, load average "
        f"{os.getloadavg()[0]:.1f}).", "",
        "| round | /proc stat read: wall ms | CPU ms | psutil.process_iter: wall ms | CPU ms |", "|---|---|---|---|---|",
        *[f"| {i + 1} | {o[0]:.2f} | {o[1]:.2f} | {p[0]:.2f} | {p[1]:.2f} |" for i, (o, p) in enumerate(rows)], "",
        f"Median CPU per scan: {own:.2f} ms (/proc) vs {ps:.2f} ms (psutil): ratio {own / ps:.2f}. At one scan every "
        f"5 s that is {own / 5000:.3%} of a core for {n} processes; the cost grows with the process count "
        "(one stat read each).",
    ]
    a.out.write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
