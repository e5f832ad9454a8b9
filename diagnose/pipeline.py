"""bundle -> tables -> signals -> rules -> report. Each stage is callable on its own."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd

from diagnose.analysis import Analysis, Window
from diagnose.bundle import Bundle, open_bundle
from diagnose.model import Finding, Signal
from diagnose.normalize import derived, load_normalizers
from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds


def phases_of(bundle: Bundle) -> list[dict[str, Any]]:
    """The bundle's phases with t_s bounds (seconds since the clock anchor), in order."""
    anchor = bundle.anchor_mono_ns
    out = []
    for rec in bundle.records("phases"):
        if "start_ns" not in rec:
            continue
        p = dict(rec)
        p["start_s"] = (int(rec["start_ns"]) - anchor) / 1e9
        end = rec.get("end_ns")
        p["end_s"] = (int(end) - anchor) / 1e9 if end is not None else math.inf
        p.setdefault("role", "measure")
        out.append(p)
    out.sort(key=lambda p: (p["start_s"], p.get("phase", 0)))
    return out


def run_window(bundle: Bundle, phases: Sequence[dict[str, Any]]) -> Window:
    measured = [p for p in phases if p.get("role", "measure") != "baseline"]
    if measured:
        return Window(min(p["start_s"] for p in measured), max(p["end_s"] for p in measured), None, "run")
    cap = bundle.manifest.get("capture", {})
    end = cap.get("ended_unix_ns")
    end_s = (int(end) - bundle.anchor_unix_ns) / 1e9 if end else math.inf
    return Window(0.0, end_s, None, "run")


def phase_window(p: dict[str, Any]) -> Window:
    return Window(p["start_s"], p["end_s"], int(p.get("phase", 0)), str(p.get("name", f"phase {p.get('phase')}")))


def normalize(bundle: Bundle, normalizers: Iterable[ModuleType] | None = None) -> dict[str, pd.DataFrame]:
    tables: dict[str, pd.DataFrame] = {}
    for mod in normalizers if normalizers is not None else load_normalizers():
        tables.update(mod.tables(bundle))
    return tables


def compute_signals(tables: dict[str, pd.DataFrame], window: Window,
                    normalizers: Iterable[ModuleType] | None = None) -> dict[str, Signal]:
    out: dict[str, Signal] = {}
    for mod in normalizers if normalizers is not None else load_normalizers():
        for s in mod.signals(tables, window):
            if s.is_finite():
                out[s.name] = s
    return out


def analyze_bundle(path: str | Path, *, rules_dirs: Sequence[str | Path] = (),
                   threshold_files: Sequence[str | Path] = (), threshold_overrides: dict[str, float] | None = None) -> Analysis:
    bundle = open_bundle(path)
    specs = load_rules(rules_dirs)
    thresholds = load_thresholds(threshold_files, threshold_overrides)
    mods = load_normalizers()
    tables = normalize(bundle, mods)
    phases = phases_of(bundle)
    signals = compute_signals(tables, run_window(bundle, phases), mods)
    measured = [p for p in phases if p.get("role", "measure") != "baseline"]
    per_phase: dict[int, dict[str, Signal]] = {}
    for p in phases:
        per_phase[int(p.get("phase", 0))] = compute_signals(tables, phase_window(p), mods)
    signals.update(derived.signals(signals, phases, per_phase, bundle.manifest))
    phase_signals = [per_phase[int(p.get("phase", 0))] for p in measured] if len(measured) > 1 else []
    labels = [str(p.get("name", "")) for p in measured] if len(measured) > 1 else []
    res = evaluate(specs, signals, thresholds, phase_signals, labels)
    analysis = Analysis(
        source=str(bundle.path),
        manifest=bundle.manifest,
        tables=tables,
        signals=signals,
        phase_signals=[per_phase[int(p.get("phase", 0))] for p in phases],
        phases=phases,
        findings=res.findings,
        not_evaluated=res.not_evaluated,
        probe_statuses=bundle.probe_statuses(),
        warnings=list(bundle.warnings),
        partial=bundle.partial,
    )
    finish_verdict(analysis)
    return analysis


def finish_verdict(analysis: Analysis) -> None:
    """The one-paragraph verdict the report leads with."""
    f = analysis.findings
    invalid = [x for x in f if x.family == "validity" and x.severity == "critical"]
    analysis.run_valid = not invalid
    s = analysis.signals

    def v(name: str, fmt: str) -> str:
        sig = s.get(name)
        return format(sig.value, fmt) if sig is not None else "n/a"

    numbers = (f"TTFT P50/P95/P99 {v('ttft_p50_ms', '.0f')}/{v('ttft_p95_ms', '.0f')}/{v('ttft_p99_ms', '.0f')} ms, "
               f"ITL P50/P95/P99 {v('itl_p50_ms', '.1f')}/{v('itl_p95_ms', '.1f')}/{v('itl_p99_ms', '.1f')} ms, "
               f"{v('output_tps', '.0f')} output tok/s, {v('request_rps', '.2f')} req/s")
    if invalid:
        title = invalid[0].title
        lead = title if title.lower().startswith("run invalid") else f"Run invalid: {title}"
        analysis.verdict = f"{lead}. Do not draw conclusions about the server from it."
    elif not s and analysis.findings:
        analysis.verdict = f"Most likely: {_lead(analysis.findings)}"
    elif any(x.severity in ("warning", "error", "critical") for x in f):
        analysis.verdict = f"Most likely: {_lead(f)}. ({numbers})" if "ttft_p50_ms" in s else f"Most likely: {_lead(f)}."
    elif "ttft_p50_ms" in s:
        analysis.verdict = f"No bottleneck found at warning level or above. {numbers}."
    else:
        analysis.verdict = "No bottleneck found at warning level or above."
    if analysis.partial:
        analysis.verdict = "Partial capture (interrupted). " + analysis.verdict


def _lead(findings: Sequence[Finding]) -> str:
    top = [x for x in findings if x.severity != "info"] or list(findings)
    return top[0].title
