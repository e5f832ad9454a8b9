#!/usr/bin/env python3
"""The load client's event-loop stalls with --otlp and --pyspy together on a real engine (issue 36), old code
against new, alternated on one vLLM CPU server.

Each capture: ``diagnose attach --realtime --otlp --pyspy -c 8 -d 20s --output-tokens 32`` against the tiny
model (harness.engine.VllmServer, its spans exported to the capture's OTLP gRPC receiver). From each bundle's
``client_health`` stream (one sample per 0.1 s, the worst of ten 10 ms timer wakes): loop lag P99 and max,
and the samples over 100 ms. ``--old-tree`` is a checkout of the code before the change (a git worktree of
the commit, with symlinks ``diagnose/probes -> ../probes``, ``diagnose/rules -> ../rules`` and
``diagnose/reports -> ../reports`` so that ``python -m diagnose`` run there imports it, not the editable
install); the new code is this tree.

    git worktree add --detach /work/wt-old 3f44a8d   # the commit before 30cf7b0 (no preexec_fn)
    (cd /work/wt-old && ln -s ../probes diagnose/probes && ln -s ../rules diagnose/rules \
        && ln -s ../reports diagnose/reports)
    python benchmarks/otlp_pyspy_stall.py --old-tree /work/wt-old --rounds 3 --out benchmarks/results/otlp_pyspy_stall.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _records(out: Path, stream: str) -> list[dict[str, Any]]:
    for name in (f"{stream}.jsonl", f"{stream}.jsonl.gz"):
        f = out / name
        if f.exists():
            data = f.read_bytes()
            text = (gzip.decompress(data) if name.endswith(".gz") else data).decode()
            return [json.loads(line) for line in text.splitlines() if line.strip()]
    return []


def main() -> int:
    from harness.engine import VllmServer, free_port
    from tests.conftest import with_eager

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-tree", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="otlp_pyspy_stall-"))
    grpc_port = free_port()
    rows: list[dict[str, Any]] = []
    with VllmServer(extra_args=with_eager([]), otlp_traces_endpoint=f"http://127.0.0.1:{grpc_port}",
                    log_path=root / "server.log") as s:
        for rnd in range(a.rounds):
            for arm, cwd in (("old", a.old_tree), ("new", REPO)):
                out = root / f"{arm}{rnd}"
                p = subprocess.run(
                    [sys.executable, "-m", "diagnose", "attach", "--url", s.url, "--no-nvml", "--realtime", "-o",
                     str(out), "--baseline", "0", "--warmup", "1", "-c", "8", "-d", "20s", "--output-tokens", "32",
                     "--otlp", "--otlp-grpc-port", str(grpc_port), "--otlp-http-port", str(free_port()), "--pyspy"],
                    cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
                lags = sorted(float(x["loop_lag_ms"]) for x in _records(out, "client_health")
                              if x.get("loop_lag_ms") is not None)
                ok = [r for r in _records(out, "requests") if r.get("ok") and not r.get("warmup")]
                row = {"round": rnd + 1, "arm": arm, "exit": p.returncode, "samples": len(lags),
                       "p99": lags[int(len(lags) * 0.99)] if lags else None, "max": lags[-1] if lags else None,
                       "over_100": sum(1 for x in lags if x > 100), "req_s": round(len(ok) / 20, 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    shutil.rmtree(root, ignore_errors=True)
    lines = ["| round | code | exit | loop lag P99 ms | max ms | samples over 100 ms | req/s |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['round']} | {r['arm']} | {r['exit']} | {r['p99']:.1f} | {r['max']:.1f} | {r['over_100']} | "
              f"{r['req_s']} |" for r in rows if r["p99"] is not None]
    for arm in ("old", "new"):
        mine = [r for r in rows if r["arm"] == arm and r["max"] is not None]
        lines.append(f"\n{arm}: {sum(1 for r in mine if r['max'] > 100)} of {len(mine)} captures with a stall over "
                     f"100 ms; max lag {min(r['max'] for r in mine):.1f}-{max(r['max'] for r in mine):.1f} ms")
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(f"# otlp_pyspy_stall\n\n`{' '.join(sys.argv)}`, {time.strftime('%Y-%m-%d')}, vLLM CPU "
                         f"0.32.0 (tiny model, eager) on this 2-core machine\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
