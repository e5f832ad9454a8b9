#!/usr/bin/env python3
"""Event-loop stall from starting probe children with a ``preexec_fn`` (issue 36: --otlp with --pyspy).

A capture with ``--otlp`` runs a gRPC server in its process; ``--pyspy`` starts a py-spy child per engine
process every window, and the Prometheus probe its parse worker. They used to be started with a
``preexec_fn`` (to leave ``--realtime``'s policy in the child). Any ``preexec_fn`` makes CPython fork the
whole process with the GIL held and run every fork handler (gRPC registers some), where without one it uses
vfork and runs none. This measures what that costs the event loop, in one run, both ways alternated:

  preexec  subprocess.Popen(..., preexec_fn=<a no-op>)          (the old way)
  argv     subprocess.Popen(child_argv(argv))                   (the new way: diagnose.capture.realtime)

Each arm is a fresh child process: a gRPC server started (as the OTLP receiver is), ``--ballast`` MB
resident (a capture's heap), an asyncio event loop sleeping 1 ms at a time and recording how late it wakes,
and a thread starting ``/bin/true`` every 50 ms for ``--seconds``. With ``--realtime`` the whole arm runs
at SCHED_RR 1 (as attach --realtime), so ``argv`` goes through child_argv's trampoline.

    python benchmarks/fork_stall.py --seconds 8 --ballast 600 --rounds 2 --out benchmarks/results/fork_stall.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _arm(mode: str, seconds: float, ballast_mb: int, realtime: bool) -> dict[str, object]:
    import asyncio
    from concurrent import futures

    import grpc

    from diagnose.capture.realtime import child_argv

    rt = False
    if realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
            rt = True
        except OSError:
            pass
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_insecure_port("127.0.0.1:0")
    server.start()
    ballast = [bytearray(1 << 20) for _ in range(ballast_mb)]
    for b in ballast:
        b[::4096] = b"\1" * len(b[::4096])  # resident, not only reserved
    spawned: list[float] = []
    policies: list[int] = []

    def spawner(stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            if mode == "preexec":
                p = subprocess.Popen(["/bin/true"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=lambda: None)  # noqa: PLW1509 - the old way, measured
            else:
                p = subprocess.Popen(child_argv(["/bin/true"]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            p.communicate()
            spawned.append((time.monotonic() - t0) * 1000)
            time.sleep(0.05)
        show = [sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"]
        out = subprocess.run(child_argv(show) if mode == "argv" else show, capture_output=True, text=True,
                             check=False, **({} if mode == "argv" else {"preexec_fn": lambda: None}))
        policies.append(int(out.stdout or -1))

    async def main() -> list[float]:
        stop = threading.Event()
        t = threading.Thread(target=spawner, args=(stop,))
        t.start()
        lags: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            await asyncio.sleep(0.001)
            lags.append((time.monotonic() - t0 - 0.001) * 1000)
        stop.set()
        t.join()
        return lags

    lags = sorted(asyncio.run(main()))
    server.stop(0)
    spawned.sort()
    del ballast
    return {"mode": mode, "realtime": rt, "wakes": len(lags), "lag_p50_ms": lags[len(lags) // 2],
            "lag_p99_ms": lags[int(len(lags) * 0.99)], "lag_max_ms": lags[-1], "spawns": len(spawned),
            "spawn_p50_ms": spawned[len(spawned) // 2], "child_policy": policies[0] if policies else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--ballast", type=int, default=600, help="MB resident in each arm")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--realtime", action="store_true", help="run the arms at SCHED_RR 1 (needs root)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.arm:
        print(json.dumps(_arm(a.arm, a.seconds, a.ballast, a.realtime)))
        return 0
    rows = []
    for r in range(a.rounds):
        for mode in ("preexec", "argv"):
            cmd = [sys.executable, __file__, "--arm", mode, "--seconds", str(a.seconds), "--ballast", str(a.ballast)]
            if a.realtime:
                cmd.append("--realtime")
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
            row = json.loads(p.stdout.strip().splitlines()[-1])
            row["round"] = r + 1
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = ["| round | arm | realtime | loop lag P50 ms | P99 ms | max ms | children started | start P50 ms | "
             "child's policy |", "|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        lines.append(f"| {x['round']} | {x['mode']} | {x['realtime']} | {x['lag_p50_ms']:.2f} | {x['lag_p99_ms']:.2f} | "
                     f"{x['lag_max_ms']:.1f} | {x['spawns']} | {x['spawn_p50_ms']:.1f} | {x['child_policy']} |")
    ratio = [(p["lag_p99_ms"] / max(q["lag_p99_ms"], 1e-9)) for p, q in zip(rows[::2], rows[1::2], strict=True)]
    lines.append("")
    lines.append("loop lag P99, preexec / argv, per round: " + ", ".join(f"{x:.0f}x" for x in ratio))
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(f"# fork_stall\n\n`{' '.join(sys.argv)}` on {os.cpu_count()} CPUs, "
                         f"{time.strftime('%Y-%m-%d')}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
