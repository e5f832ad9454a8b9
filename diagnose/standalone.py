"""Post-mortem analysis of a lone profiler trace or OTLP span file (no capture bundle)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from diagnose.analysis import Analysis
from diagnose.pipeline import finish_verdict
from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds


def analyze_trace_file(path: Path, *, rules_dirs: Sequence[str | Path] = (), threshold_files: Sequence[str | Path] = (),
                       threshold_overrides: dict[str, float] | None = None, include_python: bool = False) -> Analysis:
    from diagnose.trace import analyze_trace

    ta = analyze_trace(path, include_python=include_python)
    signals = {s.name: s for s in ta.signals if s.is_finite()}
    specs = load_rules(rules_dirs)
    res = evaluate(specs, signals, load_thresholds(threshold_files, threshold_overrides))
    analysis = Analysis(
        source=str(path),
        manifest={"schema_version": None, "kind": "trace", "trace": dict(ta.summary)},
        tables=dict(ta.tables),
        signals=signals,
        findings=res.findings,
        not_evaluated=[n for n in res.not_evaluated if _trace_relevant(n.missing)],
        warnings=list(ta.warnings),
    )
    finish_verdict(analysis)
    return analysis


def analyze_spans_file(path: Path, *, rules_dirs: Sequence[str | Path] = (), threshold_files: Sequence[str | Path] = (),
                       threshold_overrides: dict[str, float] | None = None) -> Analysis:
    from diagnose.analysis import Window
    from diagnose.normalize import otel

    tables = otel.load_spans_file(path)
    signals = {s.name: s for s in otel.signals(tables, Window(0.0, float("inf"))) if s.is_finite()}
    specs = load_rules(rules_dirs)
    res = evaluate(specs, signals, load_thresholds(threshold_files, threshold_overrides))
    analysis = Analysis(
        source=str(path),
        manifest={"schema_version": None, "kind": "spans"},
        tables=tables,
        signals=signals,
        findings=res.findings,
        not_evaluated=[n for n in res.not_evaluated if _span_relevant(n.missing)],
    )
    finish_verdict(analysis)
    return analysis


def _trace_relevant(missing: tuple[str, ...]) -> bool:
    """A lone trace cannot feed client or server rules: list only trace rules as not evaluated."""
    return all(m.startswith("trace_") for m in missing)


def _span_relevant(missing: tuple[str, ...]) -> bool:
    return all(m.startswith(("span_", "ttft_queue", "ttft_prefill", "ttft_frontend", "join_")) for m in missing)
