"""The host probe against a real competitor, end to end (probe -> normaliser): does it name the starved
thread and the process that took its core?

Target: tests/host_data/spin_target.py pinned to core 0 (``cruncher`` does the work, ``spinner`` spins through
sched_yield: a poll loop). Competitor: ``python -c 'while True: pass'`` pinned to core 0 in its own session,
its autogroup at nice ``--hog-nice`` (at equal weight the kernel let the target keep its core while py-spy
sampled it; writing /proc/<pid>/autogroup needs root or CAP_SYS_NICE). Runs: without the hog, with it.
Writes benchmarks/results/host_competitor.md with the signals and their descriptions.

    .venv/bin/python benchmarks/host_competitor.py --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from diagnose.analysis import Window  # noqa: E402
from diagnose.io.bundle import open_bundle  # noqa: E402
from diagnose.io.writer import BundleWriter  # noqa: E402
from diagnose.normalize import host  # noqa: E402
from diagnose.probes.base import CaptureContext, Target  # noqa: E402
from diagnose.probes.pyspy import PySpyProbe  # noqa: E402

SHOWN = ("host_work_wait_ratio", "host_poll_loop_wait_ratio", "host_victim_wait_ratio", "host_competitor_core_ratio",
         "host_foreign_cpu_cores")


def capture(out: Path, seconds: float, hog_nice: int | None) -> list[str]:
    tgt = subprocess.Popen(["taskset", "-c", "0", sys.executable, str(REPO / "tests/host_data/spin_target.py")],
                           stdout=subprocess.PIPE, text=True)
    assert tgt.stdout is not None
    tgt.stdout.readline()
    hog = None
    if hog_nice is not None:
        hog = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"], start_new_session=True)
        time.sleep(0.2)
        with open(f"/proc/{hog.pid}/autogroup", "w") as fh:
            fh.write(str(hog_nice))
    try:
        bw = BundleWriter(out)
        ctx = CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:9"), stop=asyncio.Event())
        probe = PySpyProbe(pid=tgt.pid, rate_hz=20, cpu_interval_s=0.5, foreign_interval_s=2.0)

        async def go() -> None:
            async def stop() -> None:
                await asyncio.sleep(seconds)
                ctx.stop.set()
            st, _ = await asyncio.gather(probe.run(ctx), stop())
            bw.set_probe_status(st)

        asyncio.run(go())
        bw.finish()
    finally:
        for p in (tgt, hog):
            if p is not None:
                p.kill()
                p.wait()
    s = {x.name: x for x in host.signals(host.tables(open_bundle(out)), Window(0.0, math.inf))}
    label = f"hog pid {hog.pid}, autogroup nice {hog_nice}" if hog else "no hog"
    return [f"### {label}", "", "| signal | value | description |", "|---|---|---|",
            *[f"| `{k}` | {s[k].value:.3f} | {s[k].description} |" for k in SHOWN if k in s], ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--hog-nice", type=int, default=-10)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "host_competitor.md")
    a = ap.parse_args()
    lines = ["# Host probe: naming the starved thread and its competitor (real processes)", "",
             f"Command: `.venv/bin/python benchmarks/host_competitor.py --seconds {a.seconds:g}` "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load average "
             f"{os.getloadavg()[0]:.1f}). The hog is a child of this script, so it is marked \"this capture\".", ""]
    with tempfile.TemporaryDirectory() as d:
        lines += capture(Path(d) / "none", a.seconds, None)
        lines += capture(Path(d) / "hog", a.seconds, a.hog_nice)
    a.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
