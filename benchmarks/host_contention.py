"""Host-contention scenario on the real vLLM CPU server: a CPU hog pinned (taskset) to the worker's core.

Starts one server (loopback port 18540), finds ``VLLM::Worker`` and the core(s) it is bound to, then runs
``diagnose attach --pyspy`` (single stream, so the server never queues) alternately without and with a
busy-loop process pinned to that core, and analyses every bundle. Prints and writes
benchmarks/results/host_contention.{json,md}: output tok/s, ITL P50, the contention signal
(``host_cpu_steal_or_contention_ratio``: run-queue wait / (run + wait) of busy engine threads), the worker
main thread's run-queue wait and the findings. ``--keep DIR`` keeps the bundles (the last hog bundle is the
sample_traces/vllm_cpu_host_contention capture).

    .venv/bin/python benchmarks/host_contention.py --duration 20s --rounds 2 --keep /tmp/contention
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from diagnose.probes.pyspy import engine_tree  # noqa: E402
from harness.engine import VllmServer  # noqa: E402

DIAG = [sys.executable, "-m", "diagnose"]
SIGNALS = ["output_tps", "itl_p50_ms", "ttft_p50_ms", "host_cpu_steal_or_contention_ratio",
           "host_run_queue_wait_ratio", "host_cpu_busy_ratio", "host_thread_saturated_max_ratio",
           "host_spin_wait_share_ratio", "host_model_forward_cpu_share_ratio", "queue_depth_max"]


def renice_tree(pid: int, nice: int) -> None:
    """Set every thread of the engine's processes to ``nice`` (niceness is per thread on Linux)."""
    for p in engine_tree(pid):
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            except OSError:
                pass


def attach(url: str, out: Path, duration: str, nice: int) -> None:
    p = subprocess.run(["nice", "-n", str(nice), *DIAG, "attach", "--url", url, "--concurrency", "1", "--duration", duration, "--warmup", "2",
                        "--baseline", "0", "--pyspy", "--pyspy-rate", "20", "--no-nvml", "-o", str(out), "--force"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"attach failed ({p.returncode}): {p.stderr[-1500:]}")


def analyze(bundle: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        js = Path(d) / "a.json"
        p = subprocess.run([*DIAG, "analyze", str(bundle), "-o", str(Path(d) / "r.html"), "--json", str(js)],
                           capture_output=True, text=True, timeout=600)
        if p.returncode not in (0, 5):  # 5: the run is invalid (diagnose/cli/exits.py); the JSON is written
            raise SystemExit(f"analyze failed: {p.stderr[-1500:]}")
        return json.loads(js.read_text())  # type: ignore[no-any-return]


def worker_wait(bundle: Path, worker_pid: int) -> float | None:
    from diagnose.io.bundle import open_bundle
    from diagnose.normalize import host

    th = host.tables(open_bundle(bundle))["host_threads"]
    w = th[(th["pid"] == worker_pid) & (th["tid"] == worker_pid)]
    run, wait = float(w["run_s"].sum()), float(w["wait_s"].sum())
    return wait / (run + wait) if run + wait > 0 else None


def summarize(a: dict[str, Any]) -> dict[str, Any]:
    sig = a.get("signals", {})
    vals = {k: (sig[k]["value"] if isinstance(sig.get(k), dict) else sig.get(k)) for k in SIGNALS}
    vals["findings"] = [f["rule_id"] for f in a.get("findings", [])]
    return vals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=18540)
    ap.add_argument("--duration", default="20s")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="keep the bundles here")
    ap.add_argument("--nice", type=int, default=0,
                    help="run the server, the client and the hog at this niceness (e.g. -10 on a machine shared "
                         "with other jobs, so that only the hog competes with the worker at equal weight)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "host_contention")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="contention-"))
    work.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    with VllmServer(port=a.port, startup_timeout_s=900) as server:
        assert server.pid is not None
        worker = next(p for p in engine_tree(server.pid) if p.role == "worker")
        cores = sorted(os.sched_getaffinity(worker.pid))
        core = cores[0]
        if a.nice:
            renice_tree(server.pid, a.nice)
        print(f"worker {worker.pid} bound to cores {cores}; hog pinned to core {core}", flush=True)
        for r in range(a.rounds):
            for hog_on in (False, True):
                name = f"{'hog' if hog_on else 'baseline'}_{r}"
                hog = None
                if hog_on:
                    hog = subprocess.Popen(["nice", "-n", str(a.nice), "taskset", "-c", str(core), sys.executable, "-c",
                                            "while True: pass"])
                    time.sleep(1)
                try:
                    attach(server.url, work / name, a.duration, a.nice)
                finally:
                    if hog is not None:
                        hog.kill()
                        hog.wait()
                res = summarize(analyze(work / name))
                res.update(run=name, hog=hog_on, worker_main_thread_wait_ratio=worker_wait(work / name, worker.pid))
                runs.append(res)
                print(json.dumps(res), flush=True)
    result = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "core": core, "worker_cores": cores,
              "nice": a.nice, "loadavg_end": os.getloadavg(),
              "duration": a.duration, "runs": runs}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    Path(str(a.out) + ".json").write_text(json.dumps(result, indent=2))
    lines = ["# Host contention: CPU hog pinned to the vLLM worker's core", "",
             f"Command: `.venv/bin/python benchmarks/host_contention.py --duration {a.duration} --rounds {a.rounds} "
             f"--nice {a.nice}` ({result['when']}, 2-core machine shared with other jobs, load average at the end "
             f"{result['loadavg_end'][0]:.1f}). Worker bound to cores {cores}; hog "
             f"(`taskset -c {core} python -c 'while True: pass'`) on core {core}; server, client and hog at "
             f"niceness {a.nice}. Load: concurrency 1, 128 input / 64 output tokens, py-spy at 20 Hz.", "",
             "| run | hog | output tok/s | ITL P50 ms | contention ratio | worker main-thread wait | findings |",
             "|---|---|---|---|---|---|---|"]
    for x in runs:
        def f(v: Any, fmt: str) -> str:
            return format(v, fmt) if isinstance(v, (int, float)) else "-"
        lines.append(f"| {x['run']} | {'yes' if x['hog'] else 'no'} | {f(x['output_tps'], '.0f')} | "
                     f"{f(x['itl_p50_ms'], '.2f')} | {f(x['host_cpu_steal_or_contention_ratio'], '.3f')} | "
                     f"{f(x['worker_main_thread_wait_ratio'], '.3f')} | {', '.join(x['findings']) or '-'} |")
    Path(str(a.out) + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if a.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
