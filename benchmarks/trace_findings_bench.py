"""Issue 11 before/after: ``analyze_trace`` at a given commit vs the working tree vs a plain ``json.load``, on
benchmarks/trace_bench.py's target traces, interleaved fresh processes (its worker), medians of --reps.

    python benchmarks/trace_findings_bench.py --before a6a18ad --reps 3

The "before" tree is exported with ``git archive`` to a temporary folder and put first on sys.path by the
worker, so both versions run in the same interpreter and venv."""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent.parent / "shared" / "traces" if (ROOT.parent.parent / "shared").is_dir() else Path("/work/shared/traces")
TRACES = (
    ("mi300x_xdit_sd3.5 (239k events)", "tracelens/mi300x_xdit_sd3.5_largest_239k_events.json.gz", 0),
    ("v100_2rank_nccl (216k events)", "hta/v100_2rank_nccl_df_index_resolver.json.gz", 1),
    ("a100_8rank_rank3 (109k events)", "hta/trace_diff_control_a100_8rank_rank3.json.gz", 3),
    ("a100_16rank_cudagraph (109k events)", "hta/a100_16rank_nccl_cudagraph_rank0.json.gz", 0),
    ("h100_qwen0.5b (18k events)", "tracelens/h100_single_gpu_qwen1.5_0.5b_chat.json.gz", 0),
)


def _run(bench: Path, mode: str, path: Path, rank: int) -> dict[str, float]:
    res = subprocess.run([sys.executable, str(bench), "--worker", mode, str(path), str(rank)],
                         capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise SystemExit(f"{bench} {mode} {path}: {res.stderr.strip().splitlines()[-1:]}")
    out: dict[str, float] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="a6a18ad")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/trace_findings_bench.md"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="trace_findings_bench_"))
    old = tmp / "before"
    old.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", args.before], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=tar, check=True)
    benches = {"json": ROOT / "benchmarks/trace_bench.py", "before": old / "benchmarks/trace_bench.py",
               "after": ROOT / "benchmarks/trace_bench.py"}
    rows = []
    for label, rel, rank in TRACES:
        gz = SHARED / rel
        if not gz.exists():
            continue
        raw = tmp / (gz.name.removesuffix(".gz"))
        raw.write_bytes(gzip.decompress(gz.read_bytes()))
        got: dict[str, list[dict[str, float]]] = {k: [] for k in benches}
        for _ in range(args.reps):
            for key, bench in benches.items():
                mode = "json" if key == "json" else "diagnose"
                got[key].append(_run(bench, mode, raw if key == "json" else gz, rank))
        raw.unlink()
        med = {k: (statistics.median(r["cpu"] for r in v), statistics.median(r["seconds"] for r in v),
                   statistics.median(r["rss_mb"] for r in v)) for k, v in got.items()}
        rows.append((label, med))
    shutil.rmtree(tmp, ignore_errors=True)
    lines = [f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python benchmarks/trace_findings_bench.py "
             f"--before {args.before} --reps {args.reps}` on the shared 2-core machine (medians of interleaved fresh "
             "processes; CPU s = user + system). before = the tree at that commit, after = this tree; json.load of the "
             "decompressed file for scale (benchmarks/trace_bench.py's target: diagnose <= json.load).", "",
             "| trace | json.load CPU s (wall) | before CPU s (wall) | after CPU s (wall) | after / before CPU (wall) "
             "| after / json.load CPU (wall) | peak RSS before / after MB |", "|---|---|---|---|---|---|---|"]
    for label, m in rows:
        (jc, jw, _), (bc, bw, br), (ac, aw, ar) = m["json"], m["before"], m["after"]
        lines.append(f"| {label} | {jc:.2f} ({jw:.2f}) | {bc:.2f} ({bw:.2f}) | {ac:.2f} ({aw:.2f}) | {ac / bc:.2f} "
                     f"({aw / bw:.2f}) | {ac / jc:.2f} ({aw / jw:.2f}) | {br:.0f} / {ar:.0f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
