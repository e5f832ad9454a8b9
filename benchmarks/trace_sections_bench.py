"""Lone-trace analysis through the report, this tree against a git ref (default main), side by side in one run.

Usage: python benchmarks/trace_sections_bench.py [--ref main] [--reps 5] [--out benchmarks/results/trace_sections_bench.md]

What is timed, in a fresh subprocess per measurement (imports before the clock), alternating the two trees per
repetition: ``analysis_s`` = ``analyze_trace`` (parse + tables) with its signals and its report sections (the
ref computes both inside ``analyze_trace``, this tree from the tables afterwards, so only the sum compares),
and ``cli_report_s`` = the lone trace through the CLI's analysis and ``render_html`` (view + sections + HTML). The ref's tree is
exported with ``git archive`` and laid out as the installed package (probes/, rules/, reports/ under
diagnose/), run with this venv's libraries. The table shows medians and new / ref as a ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = [
    ("mi300x_xdit_sd3.5 (239k events)", Path("/work/shared/traces/tracelens/mi300x_xdit_sd3.5_largest_239k_events.json.gz")),
    ("h100_qwen0.5b (18k events)", ROOT / "tests/data/traces/h100_single_gpu_qwen1.5_0.5b_chat.json.gz"),
    ("vllm_cpu worker (CPU-only)", ROOT / "tests/data/traces/vllm_cpu_0.32_worker_rank0_c8.pt.trace.json.gz"),
]

WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from diagnose.trace import analyze_trace
try:
    from diagnose.standalone import analyze_trace_file
except ImportError:
    from diagnose.pipeline import analyze as analyze_trace_file
from diagnose.reports.render import render_html
try:
    from diagnose.reports.sections import build_sections
except ImportError:
    build_sections = None
path = sys.argv[2]
t0 = time.perf_counter()
a = analyze_trace(path)
t1 = time.perf_counter()
sig = a.signals
secs = build_sections(a.tables) if build_sections is not None else a.sections
t2 = time.perf_counter()
html = render_html(analyze_trace_file(__import__("pathlib").Path(path)))
t3 = time.perf_counter()
import diagnose
assert diagnose.__file__.startswith(sys.argv[1]), diagnose.__file__
print(json.dumps({"analysis_s": t2 - t0, "cli_report_s": t3 - t2,
                  "signals": len(sig), "sections": len(secs), "html_bytes": len(html)}))
"""


def export(ref: str, dest: Path) -> Path:
    tar = dest / "ref.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(tar), ref], check=True)
    src = dest / "src"
    with tarfile.open(tar) as t:
        t.extractall(src, filter="data")
    tree = dest / "tree"
    (tree).mkdir()
    (src / "diagnose").rename(tree / "diagnose")
    for sub in ("probes", "rules", "reports"):
        (src / sub).rename(tree / "diagnose" / sub)
    return tree


def measure(tree: Path, trace: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", WORKER, str(tree), str(trace)], check=True, capture_output=True,
                         text=True, cwd=tree)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", default="main")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/trace_sections_bench.md"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        ref_tree = export(args.ref, Path(d))
        new_tree = _layout(Path(d) / "new")
        rows = []
        for label, trace in TRACES:
            if not trace.exists():
                continue
            res: dict[str, list[dict[str, float]]] = {"ref": [], "new": []}
            for _ in range(args.reps):
                res["ref"].append(measure(ref_tree, trace))
                res["new"].append(measure(new_tree, trace))
            rows.append((label, res))
            print(label, {k: statistics.median(r["cli_report_s"] for r in v) for k, v in res.items()}, flush=True)
    lines = [f"# Lone-trace analysis and report: this branch vs `{args.ref}`", "",
             f"`python benchmarks/trace_sections_bench.py --ref {args.ref} --reps {args.reps}`; medians of "
             f"{args.reps} runs each, alternating, one fresh process per run.", "",
             "| trace | step | ref s | new s | new / ref |", "|---|---|---:|---:|---:|"]
    for label, res in rows:
        for step in ("analysis_s", "cli_report_s"):
            a = statistics.median(r[step] for r in res["ref"])
            b = statistics.median(r[step] for r in res["new"])
            lines.append(f"| {label} | {step} | {a:.3f} | {b:.3f} | {b / a:.2f} |")
        same = {k: (res["ref"][0][k], res["new"][0][k]) for k in ("signals", "sections", "html_bytes")}
        lines.append(f"| {label} | signals, sections, HTML bytes (ref / new) | {same} | | |")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


def _layout(dest: Path) -> Path:
    """This working tree laid out as the installed package."""
    dest.mkdir(parents=True)
    subprocess.run(["cp", "-r", str(ROOT / "diagnose"), str(dest / "diagnose")], check=True)
    for sub in ("probes", "rules", "reports"):
        subprocess.run(["cp", "-r", str(ROOT / sub), str(dest / "diagnose" / sub)], check=True)
    return dest


if __name__ == "__main__":
    main()
