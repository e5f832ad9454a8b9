"""The only orchestrator: input -> bundle -> tables -> signals -> findings + verdict (-> report, in reports/).

Stages, each callable alone, none reaching back into an earlier one:
  open_input  a bundle directory, a sample folder, a profiler trace (file or directory of per-rank traces) or an
              OTLP span file; the last two are adapted into an in-memory bundle (diagnose.io.bundle.MemoryBundle)
  normalize   bundle streams and artifacts -> tidy tables (diagnose/normalize/, one module per source)
  signals     tables -> named signals for the run window and each phase, then the derived ones
  judge       signals -> findings, rules not evaluated, and the one verdict (rules/)
The view (reports/view_model.py) and the renderer (reports/render.py) take the Analysis this returns.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pandas as pd

from diagnose.analysis import Analysis
from diagnose.engines.experiments import named_settings, spell_change, spell_text
from diagnose.errors import BundleError, InputError
from diagnose.io.bundle import SCHEMA_VERSION, Bundle, MemoryBundle, open_bundle, open_regular, regular_file
from diagnose.model import Finding, NotEvaluated, Phase, Signal, Window, level_phases
from diagnose.normalize import TableContext, derived, load_normalizers
from diagnose.normalize.derived import slo_terms
from diagnose.normalize.prometheus import MIN_WINDOW_COVERAGE, window_coverage
from diagnose.requests import mark_run
from diagnose.rules.engine import evaluate
from diagnose.rules.spec import CATALOG_DIR, RuleSpec, load_rules, load_thresholds, rule_files
from diagnose.rules.verdict import decide
from diagnose.signals.distributions import CDF_TABLE, phase_cdfs
from diagnose.signals.host_tables import host_tables
from diagnose.signals.server_tables import server_tables
from diagnose.signals.sweep import sweep_marks
from diagnose.signals.workload_card import workload_card

InputKind = str  # "bundle" | "trace" | "spans"


# -- stage 0: the input, as a bundle ---------------------------------------------------------------------
def detect_input(path: Path) -> InputKind:
    """'bundle', 'trace' or 'spans' for what ``path`` holds; a one-line error when it is none of them."""
    if not os.path.lexists(path):
        raise InputError(f"{path}: no such file or directory")
    if not path.exists():
        raise InputError(f"{path}: a symbolic link to nothing")
    if path.is_dir():
        if (path / "manifest.json").exists():
            return "bundle"
        if any(path.glob("*.json")) or any(path.glob("*.json.gz")):
            return "trace"
        raise BundleError(f"{path} is not a capture bundle (no manifest.json) and holds no trace files")
    if not regular_file(path):
        raise InputError(f"{path}: not a regular file (a FIFO, device or socket); expected a bundle directory, "
                         "a trace or a span file")
    name = path.name.lower()
    if name.endswith((".json", ".json.gz", ".jsonl")):
        head = _head(path)
        if b"resourceSpans" in head or b"resource_spans" in head:
            return "spans"
        return "trace"
    raise InputError(f"{path}: unknown input (expected a bundle directory, a .json/.json.gz trace, or OTLP JSON spans)")


def _head(path: Path, n: int = 4096) -> bytes:
    import gzip
    import zlib

    try:
        with open_regular(path) as raw:
            if path.name.lower().endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="rb") as fh:
                    return fh.read(n)
            return raw.read(n)
    except (OSError, EOFError, zlib.error, BundleError):
        return b""  # the trace reader reports the real problem with its own message


def open_input(path: str | Path, *, include_python: bool = False) -> Bundle:
    """The bundle for ``path``: read from disk, or adapted in memory from a lone trace or span file."""
    p = Path(path)
    if p.is_dir() and not (p / "manifest.json").exists() and (p / "bundle" / "manifest.json").exists():
        p = p / "bundle"  # a sample folder: README, expected findings and the bundle beside them
    kind = detect_input(p)
    if kind == "bundle":
        return open_bundle(p)
    if kind == "spans":
        return bundle_of_spans(p)
    return bundle_of_traces(p, include_python=include_python)


def bundle_of_traces(path: Path, *, include_python: bool = False) -> MemoryBundle:
    """A trace file, or a directory of per-rank traces, as a bundle whose artifacts are those traces.
    vLLM's API-server traces (``async_llm``) beside worker traces are marked ``frontend`` and left out."""
    from diagnose.trace.analyze import trace_files

    files = trace_files(path)
    root = path if path.is_dir() else path.parent
    frontend = [f for f in files if "async_llm" in f.name]
    if len(frontend) == len(files):
        frontend = []
    artifacts = {f.name: {"kind": "torch_trace", "file": f.name, **({"role": "frontend"} if f in frontend else {})}
                 for f in files}
    b = MemoryBundle(path=root, manifest={"schema_version": SCHEMA_VERSION, "kind": "trace", "artifacts": artifacts,
                                          "options": {"include_python": include_python}, "capture": {"complete": True}},
                     kind="trace", given=path)
    if frontend:
        b.warnings.append("skipped the API-server trace(s) " + ", ".join(f.name for f in frontend)
                          + " (vLLM frontend: no kernels, no engine steps); analyse one alone by passing its file")
    return b


def bundle_of_spans(path: Path) -> MemoryBundle:
    """An OTLP span file as a bundle with one ``spans`` stream, clock anchored at its earliest span."""
    from diagnose.normalize.otel import read_spans_file

    spans = read_spans_file(path)
    anchor = min(int(s.get("start_unix_ns") or 0) for s in spans) if spans else 0
    manifest = {"schema_version": SCHEMA_VERSION, "kind": "spans",
                "capture": {"complete": True, "clock_anchor": {"unix_ns": anchor, "monotonic_ns": 0}}}
    return MemoryBundle(path=path.parent, manifest=manifest, kind="spans", streams={"spans": spans}, given=path)


# -- stage 1: tables ----------------------------------------------------------------------------------------
def normalize(bundle: Bundle, normalizers: Iterable[ModuleType] | None = None,
              ctx: TableContext | None = None) -> dict[str, pd.DataFrame]:
    """The tables of every normaliser; ``ctx`` carries the thresholds in and the normalisers' notes out."""
    ctx = ctx if ctx is not None else TableContext.defaults()
    tables: dict[str, pd.DataFrame] = {}
    for mod in normalizers if normalizers is not None else load_normalizers():
        tables.update(mod.tables(bundle, ctx))
    return tables


# -- stage 2: signals ---------------------------------------------------------------------------------------
def run_window(bundle: Bundle, phases: Sequence[Phase]) -> Window:
    """The measured window: from the first measured phase's start to the last one's end, baseline excluded."""
    measured = [p for p in phases if not p.is_baseline]
    baseline = tuple(p.phase for p in phases if p.is_baseline) or planned_baseline(bundle, phases)
    if measured:
        return Window(min(p.start_s for p in measured), max(p.end_s for p in measured), None, "run", baseline)
    end = bundle.capture_end_unix_ns
    end_s = (end - bundle.anchor_unix_ns) / 1e9 if end else math.inf
    return Window(0.0, end_s, None, "run", baseline)


def planned_baseline(bundle: Bundle, phases: Sequence[Phase]) -> tuple[int, ...]:
    """The baseline phases the manifest's workload planned, when the ``phases`` stream gave none (emptied or
    lost): their requests must stay out of the run's statistics all the same."""
    if phases:
        return ()
    planned = bundle.meta.workload.phases if bundle.meta.workload is not None else ()
    out = tuple(p.index for p in planned if p.role == "baseline" and p.index is not None)
    if out:
        bundle.warn(f"{bundle.path}: no load phase was read; the baseline phase(s) {', '.join(map(str, out))} the "
                    "manifest's workload planned are left out of the statistics")
    return out


def load_ran(bundle: Bundle, phases: Sequence[Phase]) -> bool:
    """Whether the capture sent a workload (so measured requests are expected): a phase was read, or the
    manifest says the load probe ran or lists a ``requests`` stream."""
    if phases:
        return True
    if bundle.kind != "bundle":
        return False
    load = next((s for s in bundle.meta.probes if s.name == "load"), None)
    return (load is not None and load.state not in ("skipped", "unavailable")) or "requests" in bundle.listed_streams()


def compute_signals(tables: dict[str, pd.DataFrame], window: Window,
                    normalizers: Iterable[ModuleType] | None = None) -> dict[str, Signal]:
    out: dict[str, Signal] = {}
    for mod in normalizers if normalizers is not None else load_normalizers():
        for s in mod.signals(tables, window):
            if s.is_finite():
                out[s.name] = s
    return out


# -- stage 3: judgement -------------------------------------------------------------------------------------
def _spelt(f: Finding, engine: str | None) -> Finding:
    """The finding in the engine's own words: each experiment's text naming the engine's flag
    (diagnose.engines.experiments.spell_change), and the prose around it (spell_text: 'max-num-seqs' is '--parallel'
    on llama.cpp)."""
    def words(t: str) -> str:
        return spell_text(t, engine)

    causes = tuple(replace(c, cause=words(c.cause), confirm=words(c.confirm), refute=words(c.refute),
                           status_evidence=words(c.status_evidence),
                           experiment=None if c.experiment is None else replace(c.experiment, change=words(
                               spell_change(c.experiment.change, c.experiment.variable_kind, c.experiment.variable,
                                            engine))))
                   for c in f.causes)
    out = replace(f, title=words(f.title), hypothesis=words(f.hypothesis), causes=causes)
    return f if out == f else out


def _input_kind(bundle: Bundle, tables: dict[str, pd.DataFrame], signals: dict[str, Signal]) -> str:
    """What kind of evidence the input holds, decided once (the pipeline's "not evaluated" list and the page both
    read ``Analysis.input_kind``): "serving" (requests, or server metrics: the request sections apply),
    "trace" (a kernel trace alone, as a file or as the only evidence of a bundle), "fleet" (a fleet read from its
    Prometheus: per-replica aggregates, no request) or "spans" (a span file)."""
    if bundle.kind in ("trace", "spans"):
        return str(bundle.kind)
    req = tables.get("requests")
    if req is not None and not req.empty:
        return "serving"
    reps = tables.get("fleet_replicas")
    if (reps is not None and not reps.empty) or bundle.meta.target.kind == "fleet":
        return "fleet"
    if signals and all(n.startswith("trace_") for n in signals):
        return "trace"
    return "serving"


def _relevant(kind: str, ne: NotEvaluated) -> bool:
    """A lone trace cannot feed client or server rules (a span file: client rules; a fleet capture: any rule
    but the fleet's): list as not evaluated only the rules its kind of evidence could have fed."""
    if kind == "fleet":
        return all(m.startswith("fleet_") for m in ne.missing)
    if kind == "trace":
        return all(m.startswith("trace_") for m in ne.missing)
    if kind == "spans":
        return all(m.startswith(("span_", "ttft_queue", "ttft_prefill", "ttft_frontend", "join_")) for m in ne.missing)
    return True  # "serving"


def analyze(path: str | Path, *, rules_dirs: Sequence[str | Path] = (), threshold_files: Sequence[str | Path] = (),
            threshold_overrides: dict[str, float] | None = None, include_python: bool = False,
            cost_per_hour: float | None = None) -> Analysis:
    """Analyse any input diagnose reads: every input goes through the same stages. ``cost_per_hour`` prices
    the run (the workload card's cost) instead of the price the capture recorded."""
    return analyze_opened(open_input(path, include_python=include_python), rules_dirs=rules_dirs,
                          threshold_files=threshold_files, threshold_overrides=threshold_overrides,
                          cost_per_hour=cost_per_hour)


_CATALOG_CACHE: dict[tuple[int, int], list[RuleSpec]] = {}


def _rules(rules_dirs: Sequence[str | Path]) -> list[RuleSpec]:
    """The rules: the built-in catalog alone is parsed once per process (keyed on its files' count and
    newest mtime, so an edited catalog is read again); with ``--rules`` directories, read every time."""
    if rules_dirs:
        return load_rules(rules_dirs)
    files = rule_files([CATALOG_DIR])
    key = (len(files), max((f.stat().st_mtime_ns for f in files), default=0))
    if key not in _CATALOG_CACHE:
        _CATALOG_CACHE.clear()
        _CATALOG_CACHE[key] = load_rules(())
    return list(_CATALOG_CACHE[key])


def analyze_opened(bundle: Bundle, *, rules_dirs: Sequence[str | Path] = (), threshold_files: Sequence[str | Path] = (),
                   threshold_overrides: dict[str, float] | None = None, cost_per_hour: float | None = None) -> Analysis:
    # the readiness rules judge a readiness run's measurements (diagnose/readiness/card.py), never a capture's
    specs = [s for s in _rules(rules_dirs) if s.family != "readiness"]
    thresholds = load_thresholds(threshold_files, threshold_overrides)
    mods = load_normalizers()
    ctx = TableContext(thresholds=dict(thresholds))  # the table stage's few judgements (client stalls) use them too
    tables = normalize(bundle, mods, ctx)
    bundle.check_streams()
    phases = bundle.phases()
    window = run_window(bundle, phases)
    signals = compute_signals(tables, window, mods)
    per_phase = {p.phase: compute_signals(tables, p.window(), mods) for p in phases}
    slo = slo_terms(bundle.meta)
    signals.update(derived.signals(signals, phases, per_phase, slo))
    mark_run(tables, window)  # stage-2: which requests count in the run window (the view filters on it)
    tables[CDF_TABLE] = phase_cdfs(tables, phases)  # stage-2: the per-phase CDFs the report draws
    tables.update(server_tables(tables, window))  # stage-2: the server's histograms, gauges and TTFT cross-check
    tables.update(host_tables(tables))  # stage-2: the engine's CPU by category and thread, its waits, its stacks
    measured = level_phases(phases)  # one per level: a repeated level by its first run
    sweep = len(measured) > 1
    res = evaluate(specs, signals, thresholds, [per_phase[p.phase] for p in measured] if sweep else [],
                   [p.name for p in measured] if sweep else [])
    engine = bundle.meta.target.engine
    res.findings = [_spelt(f, engine) for f in res.findings]
    verdict = decide(res.findings, signals, partial=bundle.partial, load_ran=load_ran(bundle, phases),
                     engine=engine)
    kind = _input_kind(bundle, tables, signals)
    analysis = Analysis(
        source=str(bundle.path if bundle.kind == "bundle" else bundle.source),
        manifest=bundle.manifest,
        tables=tables,
        signals=signals,
        phase_signals=[per_phase[p.phase] for p in phases],
        phases=phases,
        findings=res.findings,
        not_evaluated=[n for n in res.not_evaluated if _relevant(kind, n)],
        input_kind=kind,
        probe_statuses=bundle.probe_statuses(),
        warnings=[*bundle.warnings, *ctx.notes, *_coverage_warnings(tables, window)],
        partial=bundle.partial,
        verdict=verdict,
        run_window=window,
        thresholds=dict(thresholds),
    )
    from diagnose.capture.overhead import probe_cost

    marks = sweep_marks(phases, analysis.phase_signals, slo, analysis.run_valid)
    return replace(analysis, workload_card=workload_card(analysis, cost_per_hour), probe_cost=probe_cost(bundle.meta),
                   sweep=marks, engine_settings=named_settings(bundle.meta.target.engine_config, engine))


def _coverage_warnings(tables: dict[str, pd.DataFrame], window: Window) -> list[str]:
    cov = window_coverage(tables, window) if "metrics" in tables else None
    if cov is None or cov[0] >= MIN_WINDOW_COVERAGE:
        return []
    share, first, last = cov
    return [f"the metrics scrapes ({first:.1f}-{last:.1f} s) cover {share:.0%} of the measured window "
            f"({window.start_s:.1f}-{window.end_s:.1f} s): no server figure is computed for it, and the rules that "
            "need one are not evaluated"]


analyze_bundle = analyze  # a capture bundle directory: the same pipeline
