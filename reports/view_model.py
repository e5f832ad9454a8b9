"""Analysis -> the report's view model: one plain dict (JSON types only) that the template only displays.

Tests check this data; the HTML is a rendering of it. Order of the report: banners (partial capture,
invalid run, warnings), verdict, ranked findings, rules not evaluated, the percentile table (+ throughput,
goodput, per phase), TTFT/ITL distributions, the load-vs-latency-vs-queue timeline, contributed sections,
probe statuses, environment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from diagnose.analysis import Analysis
from diagnose.capture.profiler_window import excluded_note
from diagnose.io.manifest import Manifest
from diagnose.model import Phase, Signal, level_phases
from diagnose.reports.finding_cards import _cards, _finding, experiment_key, folds  # noqa: E402, F401
from diagnose.requests import RUN_OK
from diagnose.signals.catalog import SIGNALS

from .formatting import fmt_value
from .sections import Section, build_sections
from .sections_view import bin_values, finite, flatten, num, redact_value, section_view, unavailable
from .timeline import timeline_chart
from .view_types import (
    AttributionPart,
    AttributionRow,
    ChartSpec,
    EnvGroup,
    ErrorRow,
    Errors,
    HistogramSpec,
    LabelledWindow,
    LevelTiles,
    LineChartSpec,
    MetricRow,
    Percentiles,
    ProbeCost,
    Series,
    SloLimit,
    SweepCell,
    SweepColumn,
    SweepGroup,
    SweepRow,
    SweepTable,
    Throughput,
    Tile,
    UnavailableSpec,
    VerdictView,
    View,
    WindowTable,
)
from .workload_charts import arrivals, lengths

VIEW_SCHEMA = 1
PCTS = ("p50", "p90", "p95", "p99", "max")
METRICS = (("ttft", "TTFT", "time to first token"), ("itl", "ITL", "inter-token latency (chunk gaps, pooled)"),
           ("tpot", "TPOT", "time per output token after the first"), ("e2e", "E2E", "end-to-end request latency"))
THROUGHPUT = (("output_tps", "output throughput", "tok/s"), ("request_rps", "request throughput", "req/s"),
              ("goodput_rps", "goodput (requests meeting the SLO)", "req/s"),
              ("goodput_ratio", "share of requests meeting the SLO", "ratio"),
              ("error_rate_ratio", "error rate", "ratio"), ("requests_measured", "requests measured", "requests"))
TASK_ROW = ("task_latency", "task latency", "a whole task (attach --turns): first request sent to the last answer's "
            "end, think time included; complete tasks")
TASK_THROUGHPUT = (("task_rps", "tasks per second (complete)", "task/s"),
                   ("task_goodput_rps", "task goodput (tasks whose every answer met the SLO)", "task/s"),
                   ("tasks_abandoned_ratio", "tasks abandoned (a turn failed on every attempt)", "ratio"))
GROUP_ORDER = ("latency", "server", "host", "gpu", "trace", "details")
GROUP_TITLES = {"latency": "Latency breakdown", "server": "Server metrics", "host": "Host CPU and stacks",
                "gpu": "GPU", "trace": "Kernel trace", "details": "Details"}


def build_view(analysis: Analysis, given: Sequence[Section] | None = None) -> View:
    """The whole report as plain data (``given``: sections shown instead of those built from the tables)."""
    a = analysis
    meta = a.meta
    sections = [section_view(s) for s in (build_sections(a.tables, a.signals, a.run_window) if given is None else given)]
    sections.sort(key=lambda s: (GROUP_ORDER.index(s["group"]) if s["group"] in GROUP_ORDER else len(GROUP_ORDER),
                                 s["order"], s["id"]))
    cost = _probe_cost(a.probe_cost, bool(meta.probes))
    sweep = _sweep_levels(a) > 1
    kind = page_kind(a)
    requests_page = kind == "serving"  # a kernel trace or a fleet read holds no request: no request section
    # the judgement stage hands the findings ranked (rules.engine.evaluate): the view keeps their order
    judged = [f for f in a.findings if a.run_valid or f.family == "validity"]
    not_judged = [f for f in a.findings if not (a.run_valid or f.family == "validity")]
    verdict = _verdict(a, kind)
    return {
        "schema": VIEW_SCHEMA,
        "title": _title(meta, str(a.source)),
        "engine_settings": engine_settings(a.engine_settings),
        "source": str(a.source),
        "captured_at": meta.capture.started_at or "",
        "tool_version": meta.tool.version or "",
        "banners": _banners(a, cost),
        "run_label": _run_label(a),
        "page": {"kind": kind, "omitted": [] if requests_page else list(REQUEST_SECTIONS)},
        "verdict": verdict,
        "findings": _cards(judged, _run_label(a), verdict.get("top_rule")),
        "not_judged": [{"rule_id": f.rule_id, "title": f.title, "severity": f.severity} for f in not_judged],
        "not_evaluated": [{"rule_id": n.rule_id, "name": n.name, "missing": list(n.missing)}
                          for n in sorted(a.not_evaluated, key=lambda n: n.rule_id)],
        "percentiles": _percentiles(a) if requests_page else None,
        "errors": _errors(a.tables.get("requests")),
        "charts": {} if not requests_page else {
            # a sweep: one distribution per level, never the levels pooled into one histogram
            "ttft": None if sweep else _guard("TTFT distribution", lambda: _distribution(a, "ttft")),
            "itl": None if sweep else _guard("ITL distribution", lambda: _distribution(a, "itl")),
            "ttft_by_phase": _guard("TTFT distribution by load level", lambda: _by_phase(a, "ttft")),
            "itl_by_phase": _guard("ITL distribution by load level", lambda: _by_phase(a, "itl")) if sweep else None,
            "curve": _guard("Throughput vs latency", lambda: _curve(a)),
            "timeline": _guard("Load vs latency vs queue depth over time",
                               lambda: timeline_chart(a.tables, a.phases)),
            "input_lengths": _guard("Input lengths", lambda: lengths(a, "input")),
            "output_lengths": _guard("Output lengths", lambda: lengths(a, "output")),
            "arrivals": _guard("Arrivals over time", lambda: arrivals(a)),
        },
        "section_groups": [{"group": g, "title": GROUP_TITLES.get(g, g.capitalize()),
                            "sections": [s for s in sections if s["group"] == g]}
                           for g in dict.fromkeys(s["group"] for s in sections)],
        "show_probes": bool(requests_page or a.probe_statuses or cost),
        "probes": [{"name": p.name, "state": p.state, "reason": redact_value("reason", p.reason),
                    "detail": [[k, v] for k, v in flatten(p.detail) if v != "—" and not k.startswith("cost")]}
                   for p in sorted(a.probe_statuses, key=lambda p: p.name)],
        "probe_cost": cost,
        "environment": _environment(meta),
        "workload_card": _workload_card(a),
    }


# -- the page's kind: what it can show ------------------------------------------------------------------
# the request sections (latency percentiles and throughput, failed requests, the distributions, the timeline,
# the workload charts): a page of another kind omits them instead of printing "not available" for each
REQUEST_SECTIONS = ("latency percentiles and throughput", "failed requests", "distributions", "timeline",
                    "workload charts")


def page_kind(a: Analysis) -> str:
    """What the input is, as the page shows it: "trace" (a kernel trace alone: no request was sent or read),
    "fleet" (a fleet read from its Prometheus: per-replica aggregates, no request) or "serving" (every other
    capture, span files included: the request sections apply, and say "not available" where a table is
    missing). The pipeline decided the input's kind once (``Analysis.input_kind``); the page only names it."""
    return a.input_kind if a.input_kind in ("trace", "fleet") else "serving"


# each page kind's own headline tiles: (signal, label, unit shown); only signals already computed, never a
# number made here. Units: "ratio" is shown as a percentage, "×" a multiple of a mean, "" a count
TRACE_TILES = (("trace_gpu_busy_ratio", "GPU busy (traced window)", "ratio"),
               ("trace_step_gpu_busy_ratio", "GPU busy inside steps", "ratio"),
               ("trace_step_dur_p50_ms", "step time P50", "ms"), ("trace_step_dur_p99_ms", "step time P99", "ms"),
               ("trace_inter_step_gap_p50_ms", "CPU gap between steps P50", "ms"),
               ("trace_steps_count", "steps counted", ""), ("trace_gpu_kernels_count", "GPU kernels", ""))
FLEET_TILES = (("fleet_replicas", "replicas found", ""),
               ("fleet_load_mean", "in flight per replica (mean)", "requests"),
               ("fleet_load_busiest_mean", "busiest replica in flight", "requests"),
               ("fleet_load_idlest_mean", "idlest replica in flight", "requests"),
               ("fleet_load_imbalance_ratio", "busiest / mean load", "×"),
               ("fleet_request_rate_imbalance_ratio", "busiest / mean request rate", "×"),
               ("fleet_queue_busiest_mean", "waiting on the most queued", "requests"),
               ("fleet_restarts_total", "replica restarts", ""))
TILE_WINDOW = {"trace": "kernel trace (the traced window)", "fleet": "fleet (each replica over the read window)"}


def _kind_tiles(signals: dict[str, Signal], kind: str) -> list[Tile]:
    """A trace or fleet page's tiles, from its signals."""
    tiles = {"trace": TRACE_TILES, "fleet": FLEET_TILES}.get(kind, ())
    return [{"signal": n, "label": lab, "value": v, "unit": u, "window": TILE_WINDOW[kind]}
            for n, lab, u in tiles if (v := _sig(signals, n)) is not None]


def _requests_cell(card: dict[str, Any]) -> Any:
    """The measured requests (those every table counts); the sent ones beside them when more were sent."""
    n, sent = card.get("requests"), card.get("requests_sent")
    if n is None or sent is None or sent == n:
        return None if n is None else f"{n:,}"
    return f"{n:,} measured ({sent:,} sent; the others are warm-up or excluded windows)"


def _cold_warm(w: dict[str, Any]) -> str | None:
    """The server's state at the start and the first requests' TTFT apart from the rest (workload card)."""
    parts = [f"server {w['server']}"] if w.get("server") else []
    cold, warm = w.get("ttft_cold_p50_ms"), w.get("ttft_warm_p50_ms")
    if cold is not None and warm is not None:
        from diagnose.normalize.client import COLD_REQUESTS

        parts.append(f"first {COLD_REQUESTS} requests TTFT P50 {fmt_value(cold)} ms, "
                     f"the rest of their phase {fmt_value(warm)} ms")
    return "; ".join(parts) or None


def _workload_card(a: Analysis) -> list[dict[str, str]]:
    """The workload card as (label, value) rows for the top of the report (diagnose/signals/workload_card.py)."""
    card = a.workload_card
    if card is None:
        return []

    def num(v: Any, unit: str = "") -> str | None:
        return None if v is None else f"{fmt_value(v)}{unit}"

    def pct(d: Any) -> str | None:
        return None if not d else " / ".join(f"{d[k]:.0f}" for k in ("p50", "p90", "p99")) + " (P50/P90/P99)"

    def share(v: Any) -> str | None:
        return None if v is None else f"{float(v):.0%}"

    def observed_pct(key: str) -> str | None:
        """An observed length: its exact mean and each percentile with the bucket that bounds it."""
        d, mean, bounds = card.get(key), card.get(f"{key}_mean"), card.get(f"{key}_bounds") or {}
        if mean is None:
            return pct(d)
        parts = [f"mean {mean:.0f}"]
        for k in ("p50", "p90", "p99"):
            if d and k in d:
                lo, hi = (bounds.get(k) or [None, None])[:2]
                where = f" in ({lo:.0f}, {hi:.0f}]" if lo is not None and hi is not None else ""
                parts.append(f"{k.upper()} {'~' if bounds else ''}{d[k]:.0f}{where}")
        return ", ".join(parts) + f" ({card.get('lengths_from') or 'server histograms'})"

    def arrivals() -> str:
        disp, every = card.get("arrival_dispersion"), (card.get("observed") or {}).get("interval_s")
        if disp is None:
            return str(card["arrival"])
        kind = "bursty" if disp > 1.5 else "Poisson-like" if disp > 0.5 else "evenly spaced"
        return (f"{card['arrival']}; finished requests per {every or 0:.2g} s interval: variance/mean "
                f"{disp:.2f} ({kind})")

    server = card.get("server") or {}
    observed = card.get("observed") is not None
    rows = [("Source", str(card["source"])), ("Mode", str(card["mode"])), ("Arrivals", arrivals()),
            ("Levels", ", ".join(card["levels"]) or None), ("Requests", _requests_cell(card)),
            ("Rate (server counter)", num(card["rate_rps"], " req/s") if observed else None),
            ("Arrival rate (finished + change in waiting and running)",
             num(card["arrival_rps"], " req/s") if observed and card.get("arrival_rps") is not None else None),
            ("Mean in flight", num(card["concurrency_mean"] or server.get("running_mean"))),
            ("Input tokens", observed_pct("input_tokens")), ("Output tokens", observed_pct("output_tokens")),
            ("Prefix share (observed: prefix-cache hit ratio, a lower bound)",
             share(card.get("prefix_share_observed"))),
            ("Prefix share (planned)", share(card["prefix_share_planned"])),
            ("Cached tokens (server usage)", share(card["cached_token_share"])),
            ("Replay fidelity", _fidelity(card) if card["mode"] == "replay" else None),
            ("Cold and warm", _cold_warm(card.get("warmth") or {})),
            *_cost_row(card.get("cost"), a.run_valid),
            ("Note", card.get("note"))]
    # the measured rate, the server's prefix-cache hit ratio and the schedule lag are left out here: the
    # report shows each once elsewhere (headline tiles, signals, client self-check); --json's card has them
    return [{"label": k, "value": redact_value("workload", v)} for k, v in rows if v]


def _fidelity(card: dict[str, Any]) -> str | None:
    """How faithfully a replay was sent: lengths served against the file's (medians of the ratios); the sends
    against their schedule are the arrivals chart and the self-check's send lag (each figure once a page)."""
    f = card.get("fidelity") or {}
    parts = [f"{what} {v:.2f}" for key, what in (("input_served_over_planned_p50", "input tokens served / recorded"),
                                                 ("output_served_over_asked_p50", "output tokens served / recorded"))
             if (v := f.get(key)) is not None]
    if not parts:
        return None
    return ", ".join(parts) + " (medians; 1.00 = as recorded); sends against their schedule: the arrivals chart"


def _cost_row(cost: dict[str, Any] | None, judged: bool = True) -> list[tuple[str, str | None]]:
    """("Cost at $P/h", "$X per million output tokens, $Y per request, $Z per request within the SLO"); the
    last is judged against the SLO, so an invalid run does not show it (as its goodput)."""
    if not cost:
        return []
    if not judged:
        cost = {**cost, "per_good_request": None}
    parts = [f"${v:.3g} {what}" for key, what in (("per_mtok", "per million output tokens"),
                                                  ("per_request", "per request"),
                                                  ("per_good_request", "per request within the SLO"))
             if (v := cost.get(key)) is not None]
    return [(f"Cost at ${cost['price_per_hour']:.3g}/h", ", ".join(parts) or "no request finished: nothing to price")]


def _guard(title: str, build: Callable[[], ChartSpec | None]) -> ChartSpec | None:
    """A chart built from tables, or ``unavailable`` saying which table was unreadable (never a traceback)."""
    try:
        return build()
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        return unavailable(title, f"the input table is malformed ({type(e).__name__}: {str(e)[:200]})")


def engine_settings(named: Sequence[tuple[str, float]]) -> str:
    """The engine's settings as the pipeline named them (``Analysis.engine_settings``), in a line:
    '--parallel 2, --ctx-size 4096, --threads 1'. '' when none."""
    return ", ".join(f"{name} {value:g}" for name, value in named)


def _title(manifest: Manifest, source: str) -> str:
    t = manifest.target
    name = str(source).rstrip("/").rsplit("/", 1)[-1] or str(source)
    if not (t.model or t.engine):
        kind = {"trace": "Profiler trace", "spans": "OTLP spans"}.get(manifest.kind, "Capture")
        return f"{kind}: {name}"
    model = t.model or "unknown model"
    engine = t.engine or "unknown engine"
    ver = t.engine_version
    return f"{model} on {engine}{' ' + str(ver) if ver else ''}"


def _probe_cost(pc: dict[str, Any] | None, probes_listed: bool) -> ProbeCost | None:
    """What the probes cost the server (``Analysis.probe_cost``, computed once by the pipeline): the line, and
    the budget's adaptations."""
    if pc is None:
        if not probes_listed:
            return None
        return {"line": "What the probes cost the server was not recorded (a capture from before diagnose measured "
                        "it)", "over_budget": False, "adapted": []}
    return {"line": redact_value("probe_cost", pc["line"]), "over_budget": pc["over_budget"],
            "adapted": [redact_value("probe_cost", x) for x in pc["adapted"]]}


def _banners(a: Analysis, cost: ProbeCost | None = None) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    if a.partial:
        why = a.meta.capture.interrupted or "the capture did not finish (no end recorded)"
        out.append({"level": "error", "text": f"Partial capture: {why}. Numbers cover only what was recorded."})
    if not a.run_valid:
        out.append({"level": "error", "text": "Invalid run (see the verdict): nothing measured on it is judged; "
                                              "server-side findings and the SLO figures are shown as not judged."})
    for w in a.warnings:
        if a.partial and str(w).startswith("partial capture"):
            continue
        out.append({"level": "warning", "text": redact_value("warning", str(w))})
    if cost is not None and cost["over_budget"]:
        out.append({"level": "warning", "text": "The probes cost the server more than their budget: the numbers "
                                                "include that cost (see Probes)."})
    return out


def _sig(signals: Mapping[str, Signal], name: str) -> float | None:
    s = signals.get(name)
    return finite(s.value) if s is not None else None


KEY_NUMBERS = (("ttft_p50_ms", "TTFT P50", "ms"), ("ttft_p99_ms", "TTFT P99", "ms"), ("itl_p50_ms", "ITL P50", "ms"),
               ("itl_p99_ms", "ITL P99", "ms"), ("output_tps", "output", "tok/s"), ("request_rps", "requests", "req/s"),
               ("goodput_ratio", "within SLO", "ratio"), ("error_rate_ratio", "errors", "ratio"))
NOT_JUDGED = {"goodput_ratio", "goodput_rps", "task_goodput_rps"}  # judged against the SLO: not shown as a result on an invalid run


def _key_numbers(signals: dict[str, Signal], window: str, judged: bool) -> list[Tile]:
    return [{"signal": n, "label": lab, "value": v, "unit": u, "window": window}
            for n, lab, u in KEY_NUMBERS if (v := _sig(signals, n)) is not None and (judged or n not in NOT_JUDGED)]


def _measured_phases(a: Analysis) -> list[tuple[Phase, dict[str, Signal]]]:
    """Every measured phase (each run of a repeated level its own), with its signals."""
    return [(p, s) for p, s in zip(a.phases, a.phase_signals, strict=False) if not p.is_baseline]


def _curve(a: Analysis) -> LineChartSpec | None:
    """A sweep's throughput-latency curve: each level (a repeated one by its first run, as the sweep rules see
    it) from its phase signals, the SLO lines, and the knee and max-goodput level the pipeline judged
    (``Analysis.sweep``, diagnose/signals/sweep.py): the view marks them, it does not judge them."""
    from diagnose.normalize.derived import slo_terms
    from diagnose.reports.curve import curve_spec
    from diagnose.signals.sweep import CURVE_METRICS, sweep_levels

    marks = a.sweep
    if marks is None:
        return None
    slo = slo_terms(a.meta)
    rows: list[dict[str, Any]] = []
    for p, ps in sweep_levels(a.phases, a.phase_signals):
        terms = {k: _sig(ps, k) for k in slo}
        rows.append({"label": p.level_name, "output_tps": _sig(ps, "output_tps"),
                     **{k: _sig(ps, f"{k}_ms") for k in CURVE_METRICS},
                     **{k.removesuffix("_ms"): v for k, v in terms.items()}, "slo": terms})
    return curve_spec(rows, slo, knee=marks.knee, max_goodput=marks.max_goodput)


def _sweep_levels(a: Analysis) -> int:
    """Distinct load levels measured (a level run several times with --repeat counts once)."""
    return len(level_phases(a.phases))


ATTRIBUTION: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("TTFT, joined spans", (("ttft_queue_share_ratio", "queue"), ("ttft_prefill_share_ratio", "prefill"),
                            ("ttft_frontend_share_ratio", "frontend"),
                            ("ttft_client_network_share_ratio", "client + network"))),
    ("TTFT, server histograms", (("server_ttft_split_queue_ratio", "queue"),
                                 ("server_ttft_split_prefill_ratio", "prefill"),
                                 ("server_ttft_split_outside_ratio", "API server + network + client"))),
    ("TTFT of the slow requests, joined spans", (("ttft_tail_queue_share_ratio", "queue"),
                                                  ("ttft_tail_prefill_share_ratio", "prefill"),
                                                  ("ttft_tail_frontend_share_ratio", "frontend"),
                                                  ("ttft_tail_client_network_share_ratio", "client + network"))),
    ("TTFT of the slow requests, server histograms", (("server_ttft_tail_queue_ratio", "queue"),
                                                       ("server_ttft_tail_prefill_ratio", "prefill"),
                                                       ("server_ttft_tail_outside_ratio",
                                                        "API server + network + client"))),
    ("ITL P50", (("itl_split_decode_ratio", "a decode step alone"),
                 ("itl_split_engine_load_ratio", "engine under load (batch, prefill, preemption)"),
                 ("itl_split_outside_ratio", "API server + network + client"))),
    ("decode time, all token gaps", (("decode_time_steady_ratio", "steady steps"),
                                     ("decode_time_stall_ratio", "stalls (steps with prefill or other work)"),
                                     ("decode_time_preemption_ratio", "preemption"))),
    ("requests in flight", (("api_server_in_flight_mean", "API server + network"),
                            ("queue_depth_mean", "engine waiting"), ("running_requests_mean", "engine running"))),
)


def _attribution(signals: dict[str, Signal]) -> list[AttributionRow]:
    """Where the time went, from the signals (nothing computed here): TTFT split by joined spans when present,
    else by the server's histograms (the slow requests' likewise), the ITL P50 and the decode time split, and
    the in-flight requests split by layer."""
    rows: list[AttributionRow] = []
    for label, parts in ATTRIBUTION:
        # the first screen holds one split per quantity; the slow requests' and the decode-time splits are
        # other views of the same time, folded below it ("other splits")
        primary = not label.startswith(("TTFT of the slow", "decode time"))
        spans = label.replace("server histograms", "joined spans")
        if label.endswith("server histograms") and any(r["label"] == spans for r in rows):
            continue
        got: list[AttributionPart] = [{"signal": n, "label": lab, "value": finite(signals[n].value), "unit": signals[n].unit}
               for n, lab in parts if n in signals and signals[n].is_finite()]
        if label.startswith("decode time") and len(got) == 2 and "decode_time_preemption_ratio" not in signals:
            rows.append({"label": label, "parts": got, "primary": primary})  # no preemption counter (llama.cpp)
        elif len(got) == len(parts) or (label.startswith("TTFT") and "joined" in label and len(got) >= 3):
            rows.append({"label": label, "parts": got, "primary": primary})
    return rows


FIGURE = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?%?")


def _figures(text: str) -> set[str]:
    """The figures a sentence quotes ('22%', '454', '4,422'), as written."""
    return set(FIGURE.findall(text))


def restated(text: str, by: str) -> bool:
    """Whether ``text`` says nothing ``by`` does not: it quotes figures and every one of them is in ``by``
    (the symptom 'GPU idle 22% of the traced window (454 idle gaps, 7 steps)' under the headline 'GPU idle 22%
    of the trace, 92% of it waiting for the CPU (454 idle gaps, 7 steps)'), or ``by`` holds it word for word."""
    if not text.strip():
        return True
    if text.strip().rstrip(".").lower() in by.lower():
        return True
    figs = _figures(text)
    return bool(figs) and figs <= _figures(by)


def _hero(headline: str, detail: str, symptom: str) -> tuple[str, str]:
    """The verdict's detail and symptom as the page shows them: the symptom once, in the headline when the
    headline states it. A detail that opens with a labelled "Symptom: ..." sentence the headline restates
    starts at its next sentence; each clause of the symptom line ('A; in the kernel trace: B') the headline
    restates is left out, and the line with it when none is left. The judgement's texts are unchanged: --json
    and the CLI print them whole."""
    first, sep, rest = detail.partition(". ")
    if first.startswith("Symptom:") and sep and rest[:1].isupper() and restated(first, headline):
        detail = rest
    symptom = "; ".join(part for part in symptom.split("; ") if not restated(part, headline))
    return detail, symptom


def _verdict(a: Analysis, kind: str = "serving") -> VerdictView:
    """The judgement stage's verdict, as it is; the headline numbers beside it: per level for a sweep, a trace
    or fleet page's own tiles for those."""
    v = a.verdict
    levels = _measured_phases(a)
    keys: list[Tile] = []
    by_level: list[LevelTiles] = []
    if kind != "serving":
        keys = _kind_tiles(a.signals, kind)
    elif _sweep_levels(a) > 1:
        # one column set for every level: a number any level has, with None where a level lacks it
        shown = {k["signal"] for p, s in levels for k in _key_numbers(s, p.name, a.run_valid)}
        by_level = [
            {"label": p.name, "key_numbers": [{"signal": n, "label": lab, "value": _sig(s, n), "unit": u,
                                               "window": p.name} for n, lab, u in KEY_NUMBERS if n in shown]}
            for p, s in levels]
    else:
        keys = _key_numbers(a.signals, _run_label(a), a.run_valid)
    note = "" if a.run_valid else "SLO figures are not shown: the run is invalid, so they are not judged."
    if v is None:
        return {"level": "ok", "headline": "No verdict", "detail": "", "key_numbers": keys, "by_level": by_level,
                "partial": a.partial, "note": note, "top_rule": None, "detail_shown": "", "symptom_shown": ""}
    detail_shown, symptom_shown = _hero(v.headline, v.detail, v.symptom)
    window_signals, window_level = a.verdict_window()
    return {"level": v.level, "headline": v.headline, "detail": v.detail, "key_numbers": keys,
            "detail_shown": detail_shown, "symptom_shown": symptom_shown, "top_rule": v.top_rule,
            "attribution": _attribution(window_signals) if v.judged else [], "symptom": v.symptom,
            "attribution_level": window_level,
            "by_level": by_level, "partial": v.partial, "judged": v.judged, "note": note,
            "cause": v.cause, "cause_status": v.cause_status, "cause_evidence": v.cause_evidence,
            "refute": v.refute, "experiment": v.experiment, "share": finite(v.share) if v.share is not None else None,
            "share_of": SIGNALS.get(v.share_of, v.share_of), "explains": list(v.explains)}


def _run_label(a: Analysis) -> str:
    """The label of the run window's figures: the one measured level's name, "all levels pooled" for a sweep,
    else "whole run"."""
    levels = _measured_phases(a)
    if _sweep_levels(a) > 1:
        return "all levels pooled"
    if len(levels) > 1:  # one level run several times (--repeat)
        return f"{levels[0][0].level_name}, {len(levels)} runs pooled"
    return levels[0][0].name if levels else "whole run"



def _percentiles(a: Analysis) -> Percentiles:
    """Percentile tables from the signals (never recomputed here): the run window unless the run is a sweep
    (then each level has its own and nothing is pooled), then the baseline and each level."""
    levels = _measured_phases(a)
    sweep = _sweep_levels(a) > 1
    windows: list[LabelledWindow] = []
    if not sweep:
        windows.append({"label": _run_label(a), **_window_table(a.signals, a.run_valid)})
    for p, sigs in zip(a.phases, a.phase_signals, strict=False):
        if p.is_baseline:
            windows.append({"label": f"{p.name} (reference)", **_window_table(sigs, a.run_valid)})
        elif len(levels) > 1:  # a sweep's levels, or the runs of a repeated level (their spread)
            windows.append({"label": p.name, **_window_table(sigs, a.run_valid)})
    slos: list[SloLimit] = [{"signal": n, "value": finite(s.value), "unit": s.unit}
            for n, s in sorted(a.signals.items()) if n.startswith("slo_")]
    sweep_windows = [w for w in windows if not w["label"].endswith("(reference)")]
    return {"columns": [p.upper() if p != "max" else "max" for p in PCTS], "windows": windows, "slos": slos,
            "sweep": _sweep(windows) if sweep else None, "pooled": False,
            "levels": len(sweep_windows)}


SWEEP_COLUMNS = (("ttft", "p50"), ("ttft", "p99"), ("itl", "p50"), ("itl", "p99"), ("tpot", "p50"), ("tpot", "p99"),
                 ("e2e", "p50"), ("e2e", "p99"))
SWEEP_THROUGHPUT = (("output_tps", "output tok/s", "tok/s"), ("request_rps", "req/s", "req/s"),
                    ("goodput_ratio", "within SLO", "ratio"), ("error_rate_ratio", "errors", "ratio"))


def _sweep(phase_windows: list[LabelledWindow]) -> SweepTable:
    """One row per sweep level: how P50/P99 latency and throughput move with load."""
    lat = {m: lab for m, lab, _ in METRICS}
    columns: list[SweepColumn] = [{"group": f"{lat[m]} (ms)", "label": p.upper(), "unit": "ms"} for m, p in SWEEP_COLUMNS]
    present = [t for t in SWEEP_THROUGHPUT if any(x["signal"] == t[0] for w in phase_windows for x in w["throughput"])]
    columns += [{"group": "throughput", "label": lab, "unit": u} for _, lab, u in present]
    groups: list[SweepGroup] = []
    for c in columns:
        if groups and groups[-1]["label"] == c["group"]:
            groups[-1]["span"] += 1
        else:
            groups.append({"label": c["group"], "span": 1})
    rows: list[SweepRow] = []
    for w in phase_windows:
        by_key = {r["key"]: r["values"] for r in w["rows"]}
        thr = {x["signal"]: x["value"] for x in w["throughput"]}
        cells: list[SweepCell] = [{"value": by_key.get(m, {}).get(p), "unit": "ms", "signal": f"{m}_{p}_ms"} for m, p in SWEEP_COLUMNS]
        cells += [{"value": thr.get(n), "unit": u, "signal": n} for n, _, u in present]
        rows.append({"label": w["label"], "cells": cells})
    return {"groups": groups, "columns": columns, "rows": rows}


def _window_table(signals: dict[str, Signal], judged: bool = True) -> WindowTable:
    rows: list[MetricRow] = []
    for key, label, desc in METRICS:
        vals: dict[str, float | None] = {p: _sig(signals, f"{key}_{p}_ms") for p in PCTS}
        rows.append({"metric": label, "key": key, "description": desc, "unit": "ms", "values": vals})
    if "task_latency_p50_ms" in signals:  # tasks (attach --turns): the unit of work beside its requests
        key, label, desc = TASK_ROW
        rows.append({"metric": label, "key": key, "description": desc, "unit": "ms",
                     "values": {p: _sig(signals, f"{key}_{p}_ms") if p != "p95" else None for p in PCTS}})
    thr: list[Throughput] = [{"signal": n, "label": lab, "value": v, "unit": u}
           for n, lab, u in (*THROUGHPUT, *TASK_THROUGHPUT)
           if (v := _sig(signals, n)) is not None and (judged or n not in NOT_JUDGED)]
    if not judged and any(n in signals for n in NOT_JUDGED):
        thr.append({"signal": "", "label": "goodput: not judged (run invalid)", "value": None, "unit": ""})
    note = profiler_note(signals)
    if not any(v is not None for r in rows for v in r["values"].values()):
        return {"rows": rows, "throughput": thr, "note": "not available: no latency signals (no measured requests)"}
    return {"rows": rows, "throughput": thr, "note": note}


def profiler_note(signals: dict[str, Signal]) -> str:
    """The window's requests left out because they overlapped the engine profiler's window, as a sentence."""
    n = _sig(signals, "requests_excluded_profiler")
    if not n:
        return ""
    return excluded_note(int(n), _sig(signals, "profiler_window_s"))


def _counted_ok(a: Analysis) -> pd.DataFrame:
    """The run window's successful requests that count (the pipeline marked them: diagnose.requests.mark_run)."""
    req = a.tables["requests"]
    return req[req[RUN_OK]] if RUN_OK in req.columns else req.iloc[0:0]


def _errors(requests: pd.DataFrame | None) -> Errors:
    """Failed requests by category, with one example detail each (detail text is captured: escaped on render)."""
    if requests is None or requests.empty or "ok" not in requests.columns:
        return {"total": 0, "rows": []}
    bad = requests[~requests["ok"].fillna(False).astype(bool)]
    rows: list[ErrorRow] = []
    if not bad.empty:
        cat = bad["error"].fillna("unknown").astype(str) if "error" in bad.columns else pd.Series("unknown", bad.index)
        for name, grp in bad.groupby(cat, sort=True):
            details = grp["error_detail"].dropna().astype(str) if "error_detail" in grp.columns else pd.Series([], dtype=str)
            example = redact_value("error_detail", details.iloc[0][:300]) if not details.empty else ""
            warm = int(grp["warmup"].fillna(False).astype(bool).sum()) if "warmup" in grp.columns else 0
            rows.append({"category": str(name), "count": int(len(grp)), "warmup": warm, "example": example})
    return {"total": int(len(bad)), "requests": int(len(requests)), "rows": rows}


# -- distributions --------------------------------------------------------------------------------------
def _distribution(a: Analysis, key: str) -> HistogramSpec | UnavailableSpec:
    title = {"ttft": "TTFT distribution", "itl": "ITL distribution (pooled chunk gaps)"}[key]
    x_label = {"ttft": "time to first token (ms)", "itl": "gap between content chunks (ms)"}[key]
    req = a.tables.get("requests")
    if req is None or req.empty:
        return unavailable(title, "no requests table (the load probe did not run or recorded no requests)")
    measured = _counted_ok(a)
    if key == "ttft":
        if "ttft_ms" not in measured.columns:
            return unavailable(title, "the requests table has no ttft_ms column")
        values = num(measured["ttft_ms"])
        y_label = "requests"
    else:
        itl = a.tables.get("itl")
        if itl is None or itl.empty or "itl_ms" not in itl.columns:
            return unavailable(title, "no itl table (no streamed chunks were recorded)")
        if "rid" in itl.columns and "rid" in measured.columns:
            itl = itl[itl["rid"].isin(measured["rid"])]
        values = num(itl["itl_ms"])
        y_label = "chunk gaps"
    b = bin_values(values)
    if b["n"] == 0:
        return unavailable(title, "no successful measured requests to plot")
    if b["log_x"]:
        x_label += ", log scale"
    return {"kind": "histogram", "title": f"{title} (n={b['n']})", "x_label": x_label, "y_label": y_label, **b}


def _by_phase(a: Analysis, key: str) -> LineChartSpec | None:
    """One CDF per load level of TTFT or of the chunk gaps (ITL), to see the distribution shift with load, from
    the pipeline's stage-2 table (diagnose/signals/distributions.py); None for a single phase."""
    from diagnose.signals.distributions import CDF_TABLE

    cdf = a.tables.get(CDF_TABLE)
    if cdf is None or cdf.empty:
        return None
    series: list[Series] = []
    for (_phase, name, n), rows in cdf[cdf["metric"] == key].groupby(["phase", "name", "n"], sort=True):
        series.append({"name": f"{name} (n={n})", "axis": "left", "style": "line",
                       "points": [[float(f"{x:.5g}"), float(p)] for p, x in zip(rows["pct"], rows["value_ms"],
                                                                                 strict=True)]})
    if len(series) < 2:
        return None
    title, x_label, y_label = (("TTFT distribution by load level (CDF)", "time to first token (ms)",
                                "requests at or below (%)") if key == "ttft" else
                               ("ITL distribution by load level (CDF of the chunk gaps)",
                                "gap between content chunks (ms)", "chunk gaps at or below (%)"))
    return {"kind": "line_chart", "title": title, "series": series, "bands": [], "x_label": x_label,
            "y_label": y_label, "y2_label": ""}


# -- environment ----------------------------------------------------------------------------------------
ENV_SKIP = {"target", "workload", "host", "capture", "options", "tool", "schema_version", "probes", "streams",
            "artifacts", "kind"}


def _environment(meta: Manifest) -> list[EnvGroup]:
    """Every field the manifest records, grouped, and the bundle's contents."""
    # raw: this section lists what the capture wrote, fields this version does not type included
    recorded = meta.raw
    cap = dict(recorded.get("capture") or {})
    for raw in ("clock_anchor", "started_unix_ns", "ended_unix_ns"):  # the ISO times say the same, readably
        cap.pop(raw, None)
    if cap or recorded.get("tool"):
        cap.update(tool=recorded.get("tool"), schema_version=meta.schema_version)
    groups: list[tuple[str, Any]] = [(title, recorded.get(key)) for title, key in (
        ("Target", "target"), ("Workload", "workload"), ("Host", "host"))] + [
        ("Capture", cap), ("Options", recorded.get("options"))]
    groups += [(str(k).replace("_", " ").capitalize(), v) for k, v in sorted(recorded.items(), key=lambda kv: str(kv[0]))
               if k not in ENV_SKIP and isinstance(v, dict)]
    contents = {f"stream {k}": f"{'?' if v.records is None else v.records} records" for k, v in meta.streams.items()}
    contents.update({f"artifact {k}": f"{v.kind or ''} {v.bytes or ''} bytes".strip()
                     for k, v in meta.artifacts.items()})
    groups.append(("Bundle contents", contents))
    return [{"group": g, "rows": flatten(d)} for g, d in groups if d]
