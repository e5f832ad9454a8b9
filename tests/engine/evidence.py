"""What a failed real-engine assertion prints: the run's own evidence, so that a failure in CI (where the
bundle does not survive) says what the engine, the client and the host did instead of a bare rule id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diagnose.io.bundle import open_bundle

KEY_SIGNALS = (
    "requests_measured", "client_in_flight_mean", "queue_depth_mean", "queue_depth_max", "running_requests_mean",
    "running_requests_max", "api_server_in_flight_mean", "api_server_in_flight_share_ratio",
    "server_queue_share_of_ttft_ratio", "ttft_queue_share_ratio", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
    "itl_p99_ms", "baseline_itl_p50_ms", "client_loop_lag_p99_ms", "client_schedule_lag_p99_ms",
    "client_cpu_max_percent", "server_process_cpu_ratio", "host_cpu_steal_ratio", "server_requests_before_capture",
    "host_cpu_busy_ratio", "host_work_wait_ratio", "host_foreign_cpu_cores", "host_engine_cpu_cores_mean",
)


def run_evidence(bundle: Path, analysis: dict[str, Any] | Path | None = None) -> str:
    """One block of text: probe states, the realtime setting, the findings (id, title, held back / explained)
    and the key signals of ``analysis`` (an ``analyze --json`` dict or its file)."""
    lines: list[str] = [f"bundle {bundle}:"]
    try:
        b = open_bundle(bundle)
        lines.append("  probes: " + ", ".join(f"{s.name}={s.state}" + (f" ({s.reason[:160]})" if s.reason else "")
                                             for s in b.probe_statuses()))
        lines.append(f"  realtime: {b.manifest.get('options', {}).get('realtime')}")
    except Exception as e:  # noqa: BLE001 - evidence for a failure message must not raise itself
        lines.append(f"  (bundle unreadable: {e})")
    data: dict[str, Any] | None = None
    if isinstance(analysis, Path):
        try:
            data = json.loads(analysis.read_text())
        except (OSError, ValueError) as e:
            lines.append(f"  (analysis unreadable: {e})")
    elif isinstance(analysis, dict):
        data = analysis
    if data is not None:
        lines.append(f"  run_valid: {data.get('run_valid')}")
        for f in data.get("findings", []):
            tags = [t for t in (f"held back by {f['held_back']}" if f.get("held_back") else "",
                                f"explained by {f['explained_by']}" if f.get("explained_by") else "") if t]
            lines.append(f"  {f.get('rule_id')} [{f.get('severity')}] {f.get('title', '')}"
                         + (f" ({'; '.join(tags)})" if tags else ""))
        sig = data.get("signals", {})
        lines.append("  signals: " + ", ".join(
            f"{k}={sig[k]['value']:.4g}" for k in KEY_SIGNALS if k in sig and isinstance(sig[k].get("value"), float | int)))
        lines.extend(f"  warning: {w}" for w in data.get("warnings", [])[:8])
    return "\n".join(lines)


def analyzed_evidence(bundle: Path) -> str:
    """``run_evidence`` of a bundle analysed afresh (for a failure path that has no analysis at hand)."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "a.json"
        p = subprocess.run([sys.executable, "-m", "diagnose", "analyze", str(bundle), "-o", str(Path(tmp) / "r.html"),
                            "--json", str(out)], capture_output=True, text=True, timeout=300)
        if not out.is_file():
            return f"bundle {bundle}: analyze exited {p.returncode}: {p.stderr[-500:]}"
        return run_evidence(bundle, out)


def runs_evidence(folder: Path) -> str:
    """``analyzed_evidence`` of every bundle directly inside ``folder`` (an experiment's runs)."""
    return "\n".join(analyzed_evidence(d) for d in sorted(folder.iterdir()) if (d / "manifest.json").is_file())
