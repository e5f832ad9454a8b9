"""CPU time of `diagnose analyze` on the README's sample, against its floors and an earlier version, in one run.

Usage: python benchmarks/analyze_cpu.py [--reps 7] [--baseline REV] [--sample sample_traces/vllm_cpu_queue_bound]
                                         [--out benchmarks/results/analyze_cpu.md]

Arms, each a fresh process started as a user starts it (`python -m diagnose analyze SAMPLE -o r.html -q`):

* ``pandas``: ``python -c "import pandas"``, the floor any analysis pays (pandas imports pyarrow when it is
  installed: the dev and parquet extras have it, the plain install does not; the summary says which).
* ``imports``: the modules the analyze path imports before it reads anything (the CLI, the pipeline, the
  report renderer), without running it.
* ``analyze``: the command of this checkout.
* ``analyze@REV`` (with ``--baseline``): the same command of commit REV, extracted with `git archive` into a
  temporary directory (laid out as installed: probes/, reports/, rules/ under diagnose/) and run from there with
  this interpreter and its packages.

The arms run back to back in a rotating order per repetition, so load from other work on the machine falls on
all of them; CPU time (user + system) and peak RSS come from os.wait4 of the child, wall time from the clock.
Byte-code is written (PYTHONDONTWRITEBYTECODE is cleared for the children) and each arm runs once untimed
first, as a user's second run finds it. Medians with the spread (min-max). The summary replaces the earlier one.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORTS = ("import diagnose.cli.main, diagnose.cli.analyze, diagnose.pipeline, diagnose.analysis, "
           "diagnose.reports.render, diagnose.trace.distributed")


@dataclass
class Arm:
    name: str
    cmd: list[str]
    cwd: Path
    env: dict[str, str]
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)


def run_once(arm: Arm) -> tuple[float, float, float]:
    """(CPU s, wall s, peak RSS MB) of one child; raises when it fails."""
    t0 = time.perf_counter()
    p = subprocess.Popen(arm.cmd, cwd=arm.cwd, env=arm.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode not in (0, 4, 5):  # analyze: 4 --fail-on, 5 an invalid run; both finish the report
        raise SystemExit(f"{arm.name}: exit {p.returncode}: {err.decode(errors='replace')[-2000:]}")
    return ru.ru_utime + ru.ru_stime, wall, ru.ru_maxrss / 1024


def extract(rev: str, dest: Path) -> Path:
    """Commit ``rev`` of this repository under ``dest``, laid out as an installed package."""
    tar = dest / "src.tar"
    with tar.open("wb") as fh:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev], stdout=fh, check=True)
    src = dest / "src"
    with tarfile.open(tar) as tf:
        tf.extractall(src, filter="data")
    for sub in ("probes", "reports", "rules"):  # setup.py's package_dir: diagnose.<sub> is <sub>/
        link = src / "diagnose" / sub
        if not link.exists():
            link.symlink_to(src / sub, target_is_directory=True)
    return src


def fmt(xs: list[float], unit: str = "s", nd: int = 2) -> str:
    return f"{statistics.median(xs):.{nd}f} {unit} ({min(xs):.{nd}f}-{max(xs):.{nd}f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--baseline", help="a commit to measure beside this checkout (e.g. main)")
    ap.add_argument("--sample", default="sample_traces/vllm_cpu_queue_bound")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "analyze_cpu.md"))
    a = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    sample = (ROOT / a.sample).resolve()
    with tempfile.TemporaryDirectory(prefix="analyze-cpu-") as tmp_s:
        tmp = Path(tmp_s)
        py = sys.executable
        arms = [Arm("pandas", [py, "-c", "import pandas"], ROOT, env),
                Arm("imports", [py, "-c", IMPORTS], ROOT, env),
                Arm("analyze", [py, "-m", "diagnose", "analyze", str(sample), "-o", str(tmp / "a.html"), "-q"],
                    ROOT, env)]
        if a.baseline:
            src = extract(a.baseline, tmp)
            arms.append(Arm(f"analyze@{a.baseline}", [py, "-m", "diagnose", "analyze", str(sample), "-o",
                                                      str(tmp / "b.html"), "-q"], src, {**env, "PYTHONPATH": str(src)}))
        load0 = os.getloadavg()
        for arm in arms:  # warm-up: byte-code written, files in the page cache
            run_once(arm)
        for rep in range(a.reps):
            for arm in arms[rep % len(arms):] + arms[:rep % len(arms)]:
                cpu, wall, rss = run_once(arm)
                arm.cpu.append(cpu)
                arm.wall.append(wall)
                arm.rss_mb.append(rss)
        load1 = os.getloadavg()
    by = {arm.name: arm for arm in arms}
    med = {n: statistics.median(arm.cpu) for n, arm in by.items()}
    import pandas as pd

    lines = [
        "# `diagnose analyze` CPU time (benchmarks/analyze_cpu.py)",
        "",
        f"Command: `python benchmarks/analyze_cpu.py --reps {a.reps}"
        + (f" --baseline {a.baseline}" if a.baseline else "") + f"` on {a.sample}. "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores, load average "
        f"{load0[0]:.2f} at the start and {load1[0]:.2f} at the end (a shared machine: the arms alternate, so "
        f"load falls on all of them); Python {platform.python_version()}, pandas {pd.__version__}, pyarrow "
        + ("installed (pandas imports it)" if find_spec("pyarrow") else "not installed") + ".",
        "",
        "| arm | CPU (user+sys), median (min-max) | wall | peak RSS |",
        "|---|---|---|---|",
    ]
    for n, arm in by.items():
        lines.append(f"| {n} | {fmt(arm.cpu)} | {fmt(arm.wall)} | {fmt(arm.rss_mb, 'MB', 0)} |")
    lines += ["", f"analyze beyond the pandas import: {med['analyze'] - med['pandas']:.2f} CPU-s; beyond the "
              f"imports of its path: {med['analyze'] - med['imports']:.2f} CPU-s (reading, analysing, rendering)."]
    if a.baseline:
        b = med[f"analyze@{a.baseline}"]
        lines.append(f"analyze@{a.baseline}: {b:.2f} CPU-s; this checkout {med['analyze']:.2f} CPU-s "
                     f"({(med['analyze'] - b) / b:+.0%}); beyond the imports {b - med['imports']:.2f} -> "
                     f"{med['analyze'] - med['imports']:.2f} CPU-s.")
    lines += ["", "Raw CPU seconds per repetition:", ""]
    lines += [f"- {n}: {', '.join(f'{x:.3f}' for x in arm.cpu)}" for n, arm in by.items()]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
