"""Start-up cost as a user sees it: `diagnose analyze` of a big trace vs a plain json.load of the same file,
and `diagnose --version` vs `python -c 'import click'`, as ratios in one run.

Usage: python benchmarks/startup.py [--reps 9] [--out benchmarks/results/startup.md]

Every measurement is a fresh process started the way a user starts it: the `diagnose` console script of
this interpreter's environment (HTML report and --json written), against `python -c` running json.load on
the already decompressed file. The two arms of a pair run back to back and the order alternates per
repetition (AB BA AB ...), so load from other work on the machine falls on both. Wall time comes from the
clock, CPU time (user + system) from os.wait4 of the child. Medians, with the spread (min-max) of each arm
and of the per-pair ratios.

Traces: the shared xDiT trace (62 MB raw) and the largest trace in /work/shared/traces by decompressed
size; when that is the xDiT trace itself, the next largest too, so two different files are measured.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path("/work/shared/traces")
XDIT = SHARED / "tracelens/mi300x_xdit_sd3.5_largest_239k_events.json.gz"
JSON_LOAD = "import json, sys\nwith open(sys.argv[1], 'rb') as fh:\n    json.load(fh)"


@dataclass
class Arm:
    name: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def diagnose_exe() -> str:
    exe = Path(sys.executable).parent / "diagnose"
    if exe.exists():
        return str(exe)
    found = shutil.which("diagnose")
    if not found:
        raise SystemExit("startup.py: no `diagnose` console script next to this python or on PATH (pip install -e .)")
    return found


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one child process; raises when it fails."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"startup.py: {' '.join(cmd)} exited {p.returncode}: {err.decode()[-800:]}")
    return wall, ru.ru_utime + ru.ru_stime


def raw_size(path: Path) -> int:
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    n = 0
    with gzip.open(path, "rb") as fh:
        while blk := fh.read(1 << 22):
            n += len(blk)
    return n


def pick_traces() -> list[tuple[str, Path]]:
    sizes = sorted(((raw_size(p), p) for p in SHARED.rglob("*.json*") if p.is_file()), reverse=True)
    largest = sizes[0][1]
    out = [("xDiT SD3.5 (MI300X), the shared 62 MB trace", XDIT)]
    if largest == XDIT:
        out[0] = ("xDiT SD3.5 (MI300X): the shared 62 MB trace, also the largest in shared/traces", XDIT)
        out.append(("second largest in shared/traces (V100 2-rank NCCL)", sizes[1][1]))
    else:
        out.append(("largest in shared/traces", largest))
    return out


def pair(a: tuple[Arm, list[str]], b: tuple[Arm, list[str]], reps: int) -> None:
    for i in range(reps):
        for arm, cmd in (a, b) if i % 2 == 0 else (b, a):
            w, c = timed(cmd)
            arm.wall.append(w)
            arm.cpu.append(c)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}"


def ratio_cells(num: Arm, den: Arm) -> tuple[str, str]:
    """'ratio of medians (median of pair ratios, min-max)' for wall and CPU."""
    out = []
    for key in ("wall", "cpu"):
        n, d = getattr(num, key), getattr(den, key)
        pr = [x / y for x, y in zip(n, d, strict=True)]
        out.append(f"**{med(n) / med(d):.2f}** ({med(pr):.2f}, {min(pr):.2f}-{max(pr):.2f})")
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/startup.md")
    a = ap.parse_args()
    py, diag = sys.executable, diagnose_exe()
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="diagnose-startup-") as d:
        tmp = Path(d)
        for label, trace in pick_traces():
            raw = tmp / "trace.json"
            with gzip.open(trace, "rb") as src, open(raw, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
            mb = raw.stat().st_size / 1e6
            cli = [diag, "analyze", str(trace), "-o", str(tmp / "r.html"), "--json", str(tmp / "r.json"), "-q"]
            timed(cli)  # warm the page cache and .pyc files for both arms alike
            timed([py, "-c", JSON_LOAD, str(raw)])
            jl, an = Arm("json.load"), Arm("diagnose analyze")
            pair((jl, [py, "-c", JSON_LOAD, str(raw)]), (an, cli), a.reps)
            assert (tmp / "r.html").stat().st_size > 10_000 and (tmp / "r.json").stat().st_size > 1000
            rw, rc = ratio_cells(an, jl)
            rows.append(f"| `diagnose analyze {trace.name} -o r.html --json r.json` vs json.load of the "
                        f"decompressed file ({label}, {mb:.1f} MB raw) | {med(an.wall):.2f} ({spread(an.wall)}) | "
                        f"{med(jl.wall):.2f} ({spread(jl.wall)}) | {rw} | {med(an.cpu):.2f} ({spread(an.cpu)}) | "
                        f"{med(jl.cpu):.2f} ({spread(jl.cpu)}) | {rc} | <= 1.0 |")
            raw.unlink()
        click_arm, ver = Arm("import click"), Arm("diagnose --version")
        timed([diag, "--version"])
        pair((click_arm, [py, "-c", "import click"]), (ver, [diag, "--version"]), a.reps)
        rw, rc = ratio_cells(ver, click_arm)
        rows.append(f"| `diagnose --version` vs `python -c 'import click'` | {med(ver.wall):.3f} ({spread(ver.wall)}) | "
                    f"{med(click_arm.wall):.3f} ({spread(click_arm.wall)}) | {rw} | {med(ver.cpu):.3f} "
                    f"({spread(ver.cpu)}) | {med(click_arm.cpu):.3f} ({spread(click_arm.cpu)}) | {rc} | <= 2.0 |")
        for args in (["--help"], ["analyze", "--help"]):
            h, c2 = Arm("help"), Arm("import click")
            pair((c2, [py, "-c", "import click"]), (h, [diag, *args]), a.reps)
            rw, rc = ratio_cells(h, c2)
            rows.append(f"| `diagnose {' '.join(args)}` vs `python -c 'import click'` (not a target) | "
                        f"{med(h.wall):.3f} ({spread(h.wall)}) | {med(c2.wall):.3f} ({spread(c2.wall)}) | {rw} | "
                        f"{med(h.cpu):.3f} ({spread(h.cpu)}) | {med(c2.cpu):.3f} ({spread(c2.cpu)}) | {rc} | - |")
    load1 = os.getloadavg()
    text = f"""# Start-up cost: `diagnose analyze` vs json.load, `diagnose --version` vs `import click`

Recorded {started} by `python benchmarks/startup.py --reps {a.reps}` on {os.cpu_count()} cores shared with
other work (load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end): absolute times are noisy;
the ratios come from the two arms of each pair run back to back, order alternating (AB BA ...).

Each cell: median seconds (min-max over {a.reps} runs). Ratio cells: **ratio of the medians** (median of the
{a.reps} per-pair ratios, their min-max). Every run is a fresh process: the `diagnose` console script as a user
runs it (the .json.gz as shipped: gunzip, parse, analysis, rules, HTML report and --json written), against
`python -c` doing `json.load` of the already decompressed file (no gunzip, no analysis). CPU = user + system
time of the child (os.wait4): the figure least moved by other work on the machine.

| run | wall s | reference wall s | wall ratio | CPU s | reference CPU s | CPU ratio | target |
|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
    a.out.parent.mkdir(parents=True, exist_ok=True)
    notes = NOTES
    if a.out.exists():  # keep the hand-written analysis below the table
        old = a.out.read_text(encoding="utf-8")
        if NOTES_MARK in old:
            notes = old[old.index(NOTES_MARK):]
    a.out.write_text(text + notes, encoding="utf-8")
    print(text)


NOTES_MARK = "\n## Where the time went"
NOTES = NOTES_MARK + """ (kept by hand; benchmarks/startup.py keeps this part when it rewrites the table)
"""

if __name__ == "__main__":
    main()
