#!/usr/bin/env python3
"""What the NVML probe (on by default in `attach`) costs a GPU engine's throughput: ABBA pairs of the same
capture with and without it, against harness/gpu_toy_engine.py on a real GPU.

    python benchmarks/gpu_nvml_overhead.py --pairs 6 --duration 10 --out benchmarks/results/gpu_nvml_overhead.md

Each block is a real ``diagnose attach`` (closed loop, ``--no-metrics``: the toy engine has no /metrics) with
or without ``--no-nvml``, in ABBA order on one engine; output tok/s from the bundle's analysis. Needs a CUDA
GPU (``--engine-args "--device cpu ..."`` runs it on CPU to check the script; the NVML arm is then
"unavailable" and the figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 180.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"gpu_nvml_overhead: the toy engine exited with code {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"gpu_nvml_overhead: the toy engine was not healthy within {timeout_s:.0f} s")


def block(url: str, out: Path, nvml: bool, a: argparse.Namespace) -> dict[str, object]:
    cmd = [sys.executable, "-m", "diagnose", "attach", "--url", url, "-o", str(out), "--no-metrics",
           "-c", str(a.concurrency), "-d", f"{a.duration}s", "--input-tokens", "128", "--output-tokens", "64",
           "--baseline", "0", "--warmup", "4", *([] if nvml else ["--no-nvml"])]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.duration + 120)
    if p.returncode not in (0, 1):
        sys.exit(f"gpu_nvml_overhead: attach failed ({p.returncode}): {p.stderr[-500:]}")
    js = out.parent / (out.name + ".json")
    subprocess.run([sys.executable, "-m", "diagnose", "analyze", str(out), "-o", str(out.parent / (out.name + ".html")),
                    "--json", str(js), "-q"], check=False, timeout=120)
    d = json.loads(js.read_text())
    sig = {k: (v.get("value") if isinstance(v, dict) else v) for k, v in d.get("signals", {}).items()}
    st = {p["name"]: p["state"] for p in d.get("probes", [])}
    return {"nvml": nvml, "tps": sig.get("output_tps"), "itl_p99_ms": sig.get("itl_p99_ms"),
            "loop_lag_p99_ms": sig.get("client_loop_lag_p99_ms"), "nvml_state": st.get("nvml", "off")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--port", type=int, default=8201)
    ap.add_argument("--engine-args", default="--weights-gb 16 --hidden 16384 --max-batch 64")
    ap.add_argument("--engine-python", help="interpreter for the engine (one with torch; default: this one)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-nvml-ovh-"))
    eng = subprocess.Popen([a.engine_python or sys.executable, str(ROOT / "harness" / "gpu_toy_engine.py"), "--port", str(a.port),
                            *shlex.split(a.engine_args)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows: list[dict[str, object]] = []
    try:
        wait_healthy(a.port, eng)
        url = f"http://127.0.0.1:{a.port}"
        block(url, tmp / "warmup", False, a)
        for pair in range(a.pairs):
            for nvml in ((False, True) if pair % 2 == 0 else (True, False)):
                r = block(url, tmp / f"p{pair}-{'on' if nvml else 'off'}", nvml, a)
                r["pair"] = pair
                rows.append(r)
                print(f"pair {pair} nvml {'on ' if nvml else 'off'}: {r['tps']:.0f} tok/s, ITL P99 "
                      f"{r['itl_p99_ms']:.2f} ms, loop lag P99 {r['loop_lag_p99_ms']}, nvml {r['nvml_state']}",
                      flush=True)
    finally:
        eng.terminate()
        eng.wait(timeout=30)
    ratios = []
    for pair in range(a.pairs):
        arm = {r["nvml"]: r for r in rows if r["pair"] == pair}
        ratios.append(float(arm[True]["tps"]) / float(arm[False]["tps"]))  # type: ignore[arg-type]
    itl = statistics.median(
        float(next(r for r in rows if r["pair"] == p and r["nvml"])["itl_p99_ms"])  # type: ignore[arg-type]
        / float(next(r for r in rows if r["pair"] == p and not r["nvml"])["itl_p99_ms"])  # type: ignore[arg-type]
        for p in range(a.pairs))
    med = statistics.median(ratios)
    lines = ["# NVML probe: throughput cost on a GPU engine", "",
             f"`python benchmarks/gpu_nvml_overhead.py --pairs {a.pairs} --duration {a.duration} --concurrency "
             f"{a.concurrency} --engine-args \"{a.engine_args}\"` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).",
             "", "Real `diagnose attach` blocks against harness/gpu_toy_engine.py, NVML at its default 10 Hz vs "
             "`--no-nvml`, ABBA order on one engine.", "",
             "| pair | arm | output tok/s | ITL P99 ms | client loop lag P99 ms | nvml |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pair']} | {'on' if r['nvml'] else 'off'} | {r['tps']:.0f} | {r['itl_p99_ms']:.2f} | "
                     f"{float(r['loop_lag_p99_ms'] or 'nan'):.2f} | {r['nvml_state']} |")
    lines += ["", f"Throughput on/off, median of {a.pairs} pairs: **{med:.3f} ({(med - 1) * 100:+.1f}%)**; per pair: "
              + ", ".join(f"{x:.3f}" for x in ratios) + f". ITL P99 on/off, median: {itl:.3f}."]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
