"""Trace reader on inputs without event boundaries (issue 12, defect 6): the reader before the fix vs now, side
by side in one run.

Usage: python benchmarks/trace_read_linear.py [--timeout 60] [--out benchmarks/results/trace_read_linear.md]

The old reader is diagnose/trace/parse.py as of commit a6a18ad (read with ``git show``), loaded beside the
current one. Each measurement runs in a fresh subprocess with a wall-clock limit (the old reader runs for
minutes on some of these inputs: it is killed at the limit and reported as "> limit"). Inputs, made in a
temporary directory (sparse where they can be):

* ``{"traceEvents": [`` followed by 300 MB of spaces;
* a small valid trace followed by a 2 GB sparse (zero-filled) tail;
* one 32 MB and one 50 MB event (an ``args`` list of small objects, so ``}, {`` appears inside it), between
  two ordinary kernel events;
* a real trace (tests/data/traces, H100 Qwen 0.5B), to show the ordinary case did not get slower.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OLD_COMMIT = "a6a18ad"
KERNEL = b'{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7}'


def make_inputs(d: Path) -> list[tuple[str, Path]]:
    out = []
    p = d / "spaces.json"
    with open(p, "wb") as fh:
        fh.write(b'{"traceEvents": [')
        block = b" " * (1 << 20)
        for _ in range(300):
            fh.write(block)
    out.append(("300 MB of spaces after the array opens", p))
    p = d / "sparse_tail.json"
    p.write_bytes(b'{"traceEvents": [' + KERNEL + b", " + KERNEL + b"]}")
    os.truncate(p, 2 << 30)
    out.append(("valid trace + 2 GB sparse tail", p))
    for mb in (32, 50):
        p = d / f"event_{mb}mb.json"
        item = b'{"a": 1}, '
        n = (mb << 20) // len(item)
        with open(p, "wb") as fh:
            fh.write(b'{"traceEvents": [' + KERNEL + b', {"ph": "X", "cat": "cpu_op", "name": "big", "ts": 3, '
                     b'"dur": 1, "pid": 0, "tid": 1, "args": {"items": [')
            chunk = item * 100_000
            for _ in range(n // 100_000):
                fh.write(chunk)
            fh.write(b'{"a": 1}]}}, ' + KERNEL + b"]}")
        out.append((f"one {mb} MB event", p))
    real = ROOT / "tests/data/traces/h100_single_gpu_qwen1.5_0.5b_chat.json.gz"
    if real.exists():
        out.append(("real trace (H100 Qwen 0.5B, gz)", real))
    return out


def worker(which: str, old_src: str, path: str) -> None:
    """One read in this process: prints 'seconds<TAB>outcome'."""
    sys.path.insert(0, str(ROOT))
    if which == "old":
        spec = importlib.util.spec_from_file_location("diagnose.trace._parse_old", old_src)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
        read = mod.read_trace
    else:
        from diagnose.trace.parse import read_trace as read
    from diagnose.errors import DiagnoseError

    t0 = time.perf_counter()
    try:
        rt = read(path)
        what = f"{rt.events_total} events"
    except DiagnoseError as e:
        what = "error: " + str(e).replace(path, "FILE")
    print(f"{time.perf_counter() - t0:.2f}\t{what}")


def measure(which: str, old_src: Path, path: Path, limit: float) -> tuple[float | None, str]:
    cmd = [sys.executable, __file__, "--worker", which, str(old_src), str(path)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return None, f"killed at the {limit:.0f} s limit"
    line = (r.stdout.strip().splitlines() or ["\t" + r.stderr.strip().splitlines()[-1]])[-1]
    secs, _, what = line.partition("\t")
    return (float(secs) if secs else None), what


def _fmt(s: float | None, limit: float) -> str:
    return f"{s:.2f}" if s is not None else f"> {limit:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/trace_read_linear.md")
    ap.add_argument("--worker", nargs=3, metavar=("WHICH", "OLD_SRC", "PATH"))
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        old_src = d / "parse_old.py"
        old_src.write_text(subprocess.run(["git", "show", f"{OLD_COMMIT}:diagnose/trace/parse.py"], cwd=ROOT,
                                          capture_output=True, text=True, check=True).stdout)
        rows = []
        for label, path in make_inputs(d):
            old_s, old_what = measure("old", old_src, path, args.timeout)
            new_s, new_what = measure("new", old_src, path, args.timeout)
            ratio = f"{old_s / new_s:.1f}x" if old_s and new_s else (
                f"> {args.timeout / new_s:.0f}x" if new_s else "-")
            rows.append(f"| {label} | {_fmt(old_s, args.timeout)} | {_fmt(new_s, args.timeout)} | {ratio} | "
                        f"{old_what} | {new_what} |")
            print(rows[-1], flush=True)
    text = "\n".join([
        "# Trace reader without event boundaries: before (a6a18ad) vs now",
        "",
        f"`python benchmarks/trace_read_linear.py --timeout {args.timeout:.0f}` on {os.cpu_count()} cores "
        f"(shared machine), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Seconds of wall time per read, "
        "each in a fresh process; the old reader is killed at the limit.",
        "",
        "| input | old s | new s | old/new | old outcome | new outcome |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ])
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
