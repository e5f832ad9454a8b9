"""HTML report size and render time: diagnose's capped inline-SVG report vs a plotly report of the same data.

Usage: python benchmarks/report_bench.py [--sizes 1000,5000,20000] [--reps 3] [--out benchmarks/results/report_bench.md]

diagnose: ``render_html`` of a synthetic Analysis (reports/demo.py: a 3-level sweep, 64 output tokens per
request) - the whole report (findings, tables, 2 histograms, the timeline and 5 contributed sections).
Alternative: the usual way to make a one-file offline chart report, plotly's ``write_html`` with
``include_plotlyjs=True``, drawing only the three core charts (TTFT histogram, ITL histogram, TTFT + in-flight
timeline) from the raw arrays, as plotly needs them for client-side binning. plotly runs in its own venv
(~/.cache/diagnose/plotly-venv, built here when missing) as a worker subprocess reading the raw data as JSON.
Times are medians of --reps; the machine is shared, so read ratios rather than absolute times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLOTLY_VENV = Path.home() / ".cache" / "diagnose" / "plotly-venv"

WORKER = r"""
import json, sys, time
import plotly.graph_objects as go
from plotly.subplots import make_subplots
data = json.load(open(sys.argv[1]))
t = time.perf_counter()
fig = make_subplots(rows=3, cols=1, specs=[[{}], [{}], [{"secondary_y": True}]],
                    subplot_titles=("TTFT distribution", "ITL distribution", "Load vs latency over time"))
fig.add_trace(go.Histogram(x=data["ttft"], name="TTFT (ms)"), row=1, col=1)
fig.add_trace(go.Histogram(x=data["itl"], name="ITL (ms)"), row=2, col=1)
fig.add_trace(go.Scattergl(x=data["sent"], y=data["ttft_all"], mode="markers", name="TTFT per request"), row=3, col=1)
fig.add_trace(go.Scatter(x=data["grid"], y=data["inflight"], name="in flight", line_shape="hv"),
              row=3, col=1, secondary_y=True)
fig.write_html(sys.argv[2], include_plotlyjs=True, full_html=True)
print(time.perf_counter() - t)
"""


def ensure_plotly() -> Path | None:
    py = PLOTLY_VENV / "bin" / "python"
    if not py.exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", str(PLOTLY_VENV)], check=True)
            subprocess.run([str(py), "-m", "pip", "install", "-q", "plotly==6.*"], check=True)
        except (subprocess.CalledProcessError, OSError) as e:
            print(f"plotly venv unavailable ({e}); alternative skipped", file=sys.stderr)
            return None
    return py


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,5000,20000", help="approximate request counts")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "report_bench.md")
    args = ap.parse_args()
    import numpy as np

    from diagnose.reports.demo import synthetic_analysis
    from diagnose.reports.render import render_html

    plotly_py = ensure_plotly()
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        per_level = n / (6.29 + 14.9 + 21.9)  # req/s of the synthetic levels (1, 4, 16)
        a = synthetic_analysis(per_level_s=per_level)
        req, itl = a.tables["requests"], a.tables["itl"]
        times, html = [], ""
        for _ in range(args.reps):
            t = time.perf_counter()
            html = render_html(a)
            times.append(time.perf_counter() - t)
        ours_bytes, ours_s = len(html.encode()), statistics.median(times)
        alt_bytes = alt_s = None
        if plotly_py is not None:
            sent, end = np.sort(req["sent_s"].to_numpy()), np.sort(req["end_s"].to_numpy())
            grid = np.linspace(sent.min(), end.max(), 300)
            ok = req[~req["warmup"] & req["ok"]]
            data = {"ttft": ok["ttft_ms"].round(3).tolist(), "itl": itl["itl_ms"].round(3).tolist(),
                    "sent": req["sent_s"].round(4).tolist(), "ttft_all": req["ttft_ms"].round(3).tolist(),
                    "grid": grid.round(3).tolist(),
                    "inflight": (np.searchsorted(sent, grid, "right") - np.searchsorted(end, grid, "right")).tolist()}
            with tempfile.TemporaryDirectory() as d:
                src, out = Path(d) / "data.json", Path(d) / "plotly.html"
                src.write_text(json.dumps(data))
                ts = []
                for _ in range(args.reps):
                    r = subprocess.run([str(plotly_py), "-c", WORKER, str(src), str(out)],
                                       capture_output=True, text=True, check=True)
                    ts.append(float(r.stdout.strip().splitlines()[-1]))
                alt_bytes, alt_s = out.stat().st_size, statistics.median(ts)
        rows.append((len(req), len(itl), ours_bytes, ours_s, alt_bytes, alt_s))
        print(rows[-1], flush=True)
    lines = [
        "# HTML report: size and render time", "",
        f"`python benchmarks/report_bench.py --sizes {args.sizes} --reps {args.reps}` on {time.strftime('%Y-%m-%d')}, "
        "2-core shared machine, median of reps.", "",
        "diagnose = the whole report (verdict, findings, tables, TTFT/ITL histograms, timeline, 5 contributed "
        "sections) as inline SVG with capped points; plotly = only the three core charts, raw arrays + inlined "
        "plotly.js (`write_html(include_plotlyjs=True)`).", "",
        "| requests | ITL gaps | diagnose KB | diagnose render s | plotly KB | plotly write s | size ratio plotly/diagnose "
        "| time ratio plotly/diagnose |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for nreq, ngap, ob, os_, ab, as_ in rows:
        alt = (f"{ab / 1024:,.0f} | {as_:.2f} | {ab / ob:.1f}x | {as_ / os_:.1f}x" if ab is not None and as_ is not None
               else "n/a | n/a | n/a | n/a")
        lines.append(f"| {nreq:,} | {ngap:,} | {ob / 1024:,.0f} | {os_:.2f} | {alt} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
