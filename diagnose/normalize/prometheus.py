"""Server metrics: Prometheus scrapes (streams ``metrics`` + ``metric_families``) -> tables and signals.

Engine-specific names are mapped to engine-neutral signals with ``diagnose.engines.detect.METRIC_MAPS``
(docs/engine-signals.md). Tables:

* ``metrics``: long table, one row per scrape x neutral signal x data-parallel engine index:
  ``t_s, t0_s`` (previous scrape), ``signal, value, delta`` (counter increase since the previous scrape,
  resets detected), ``engine`` (vllm, sglang, ...), ``dp`` (data-parallel engine index label, "" if none),
  ``kind, unit, agg`` (how to combine over ``dp``: sum or max), ``metric`` (the wire name used).
* ``metrics_hist``: histogram bucket increases per scrape interval: ``t0_s, t_s, signal, le, count``
  (cumulative over ``le``; bounds in the base unit, seconds or tokens; ``le`` = inf for the +Inf bucket).
* ``metrics_hist_sum``: ``t0_s, t_s, signal, count, sum`` per interval.
* ``metrics_scrapes``: ``t_s, scrape_ms, parse_ms, samples`` (probe cost), ``restarted`` (the server's
  ``process_start_time_seconds`` changed since the previous scrape: every counter and histogram restarts).
* ``server_config``: ``key, value`` (``kv_capacity_tokens``, ``max_num_seqs`` when known).

A window takes every scrape interval that overlaps it, so its counters and histograms include the
observations of the whole window (and at most one scrape interval on either side). Scrapes that cover less
than ``MIN_WINDOW_COVERAGE`` of a window (the probe stopped early, or started late) give that window no
server figures but ``metrics_window_coverage_ratio``: a histogram of the first seconds is not the window's.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from contextvars import ContextVar
from typing import Any, Literal

import numpy as np
import pandas as pd

from diagnose.analysis import Window
from diagnose.engines.detect import DP_LABEL, MetricRef, engine_from_metric_names, metric_map
from diagnose.io.bundle import Bundle, lines_text
from diagnose.model import Signal, Source
from diagnose.normalize import TableContext
from diagnose.normalize.prom_hist import (
    QuantileEstimate,
    TailMean,
    counter_increments,
    histogram_quantile,
    histogram_tail_mean,
    parse_le,
)
from diagnose.normalize.prom_rows import HistAgg, HistRow, HistSeries, HistSumRow, MetricRow, ScrapeRow
from diagnose.numbers import fmt_value
from diagnose.requests import finite, in_flight_mean, select, span_s
from diagnose.signals.catalog import SIGNALS

SOURCE: Source = "server"
METRIC_COLUMNS = ["t_s", "t0_s", "signal", "value", "delta", "engine", "dp", "kind", "unit", "agg", "metric"]
HIST_COLUMNS = ["t0_s", "t_s", "signal", "le", "count"]
HIST_SUM_COLUMNS = ["t0_s", "t_s", "signal", "count", "sum"]

MIN_WINDOW_COVERAGE = 0.8  # share of a window between the first and the last scrape, below which: no figures
MAX_VALUE = 1e18  # a sample beyond this (1e308, an integer >= 2**63) is malformed: sums and rates would overflow

_Series = dict[tuple[tuple[str, str], ...], HistSeries]


def _index(samples: Any) -> tuple[dict[str, list[tuple[dict[str, str], float]]], int]:
    idx: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    bad = 0
    for s in samples if isinstance(samples, list) else []:
        if (isinstance(s, list) and len(s) == 3 and isinstance(s[0], str) and isinstance(s[1], dict)
                and isinstance(s[2], (int, float)) and not isinstance(s[2], bool) and -MAX_VALUE <= s[2] <= MAX_VALUE):
            idx[s[0]].append((s[1], float(s[2])))
        elif not (isinstance(s, list) and len(s) == 3 and s[2] is None):
            bad += 1
    return idx, bad


def _scalar_rows(ref: MetricRef, idx: dict[str, list[tuple[dict[str, str], float]]], engine: str,
                 dp_label: str, t_s: float) -> list[MetricRow]:
    # prometheus_client's parser exposes every counter sample as <family>_total, whatever the wire said
    cands = [n if ref.kind != "counter" or n.endswith("_total") else f"{n}_total" for n in ref.names]
    names = [n for n in cands if n in idx]
    if ref.combine == "first":
        names = names[:1]
    groups: dict[str, list[float]] = defaultdict(list)
    for n in names:
        for labels, v in idx[n]:
            if ref.matches_labels(labels):
                groups[str(labels.get(dp_label, ""))].append(v * ref.scale)
    return [{"t_s": t_s, "signal": ref.signal, "value": sum(vs) if ref.agg == "sum" else max(vs), "dp": dp,
             "engine": engine,
             "kind": ref.kind, "unit": ref.unit, "agg": ref.agg, "metric": "+".join(names)}
            for dp, vs in groups.items()]


_BucketOf = dict[tuple[int, tuple[tuple[str, str], ...]], tuple[tuple[tuple[str, str], ...], float] | None]
_STR = {str}


def _bucket_of(ref: MetricRef, labels: dict[str, str]) -> tuple[tuple[tuple[str, str], ...], float] | None:
    """A bucket sample's series key (its labels but ``le``) and upper bound; None when it is not one of ``ref``'s."""
    if "le" not in labels or not ref.matches_labels(labels):
        return None
    key = tuple(sorted((k, str(x)) for k, x in labels.items() if k != "le"))
    try:
        le = parse_le(str(labels["le"]))
    except ValueError:
        return None
    return key, le * ref.scale if math.isfinite(le) else le


def _hist_series(ref: MetricRef, idx: dict[str, list[tuple[dict[str, str], float]]],
                 seen: _BucketOf | None = None) -> _Series:
    """``seen``: the buckets already read by label set, over the scrapes of one table (every scrape repeats
    the same label sets: each is matched, sorted and parsed once)."""
    name = next((n for n in ref.names if f"{n}_bucket" in idx), None)
    series: _Series = {}
    if name is None:
        return series
    seen = {} if seen is None else seen
    for labels, v in idx[f"{name}_bucket"]:
        if {*map(type, labels.values())} <= _STR:  # label values as the exposition format has them: text
            ck = (id(ref), tuple(labels.items()))
            hit = seen[ck] if ck in seen else seen.setdefault(ck, _bucket_of(ref, labels))
        else:  # a malformed label value (a number, a list): read alone
            hit = _bucket_of(ref, labels)
        if hit is None:
            continue
        key, bound = hit
        s = series.setdefault(key, {"b": {}, "sum": math.nan, "count": math.nan})
        s["b"][bound] = v
    totals: tuple[tuple[str, Literal["sum", "count"]], ...] = (("_sum", "sum"), ("_count", "count"))
    for suffix, field in totals:
        for labels, v in idx.get(f"{name}{suffix}", []):
            key = tuple(sorted((k, str(x)) for k, x in labels.items()))
            if key in series:
                series[key][field] = v * (ref.scale if field == "sum" else 1.0)
    return series


def _hist_delta(cur: HistSeries, prev: HistSeries | None, restarted: bool = False) -> HistSeries | None:
    """Increase of one histogram series between two scrapes; a decrease anywhere, or a server restart
    (new process start time), means a reset: everything in the new scrape is new."""
    if prev is None:
        return None
    reset = restarted or cur["count"] < prev["count"] or any(v < prev["b"].get(le, 0.0) for le, v in cur["b"].items())
    if reset:
        return {"b": dict(cur["b"]), "sum": cur["sum"], "count": cur["count"]}
    return {"b": {le: v - prev["b"].get(le, 0.0) for le, v in cur["b"].items()},
            "sum": cur["sum"] - prev["sum"], "count": cur["count"] - prev["count"]}


def tables(bundle: Bundle, ctx: TableContext | None = None) -> dict[str, pd.DataFrame]:
    numbered = list(bundle.iter_numbered("metrics"))
    if not numbered:
        return {}
    numbered.sort(key=lambda nr: nr[1]["t_ns"])
    records = [r for _n, r in numbered]
    bad_lines: list[int] = []
    fam_names = [str(f.get("name", "")) for f in bundle.iter_records("metric_families")]
    sample_names = (str(s[0]) for s in records[0].get("samples") or [] if isinstance(s, list) and s)
    engine = (engine_from_metric_names(fam_names) or engine_from_metric_names(sample_names)
              or bundle.meta.target.engine or "unknown")
    refs = metric_map(engine)
    dp_label = DP_LABEL.get(engine, "")
    anchor = bundle.anchor_mono_ns
    rows: list[MetricRow] = []
    hist_rows: list[HistRow] = []
    sum_rows: list[HistSumRow] = []
    scrapes: list[ScrapeRow] = []
    config: dict[str, float] = {}
    prev_hist: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, HistSeries]] = {}
    seen: _BucketOf = {}  # bucket label sets already read (the same in every scrape)
    bad_total = 0
    start_time: float | None = None
    for line, rec in numbered:
        t_s = (rec["t_ns"] - anchor) / 1e9
        idx, bad = _index(rec.get("samples"))
        bad_total += bad
        if bad:
            bad_lines.append(line)
        started = next((v for _l, v in idx.get("process_start_time_seconds", [])), None)
        restarted = started is not None and start_time is not None and started != start_time
        start_time = started if started is not None else start_time
        scrapes.append({"t_s": t_s, "scrape_ms": rec.get("scrape_ms"), "parse_ms": rec.get("parse_ms"),
                        "samples": sum(len(v) for v in idx.values()), "restarted": restarted})
        for labels, _v in idx.get("vllm:cache_config_info", [])[:1]:
            for key, label in (("kv_capacity_tokens", "kv_cache_size_tokens"), ("kv_block_size_tokens", "block_size"),
                               ("kv_blocks", "num_gpu_blocks")):
                with contextlib.suppress(KeyError, ValueError):
                    config[key] = float(labels[label])
            if str(labels.get("enable_prefix_caching", "")).lower() in ("true", "false"):
                config["prefix_caching"] = 1.0 if labels["enable_prefix_caching"].lower() == "true" else 0.0
        for ref in refs:
            if ref.kind != "histogram":
                rows.extend(_scalar_rows(ref, idx, engine, dp_label, t_s))
                continue
            agg: HistAgg = {"b": defaultdict(float), "sum": 0.0, "count": 0.0, "t0": t_s, "n": 0}
            for skey, cur in _hist_series(ref, idx, seen).items():
                prev = prev_hist.get((ref.signal, skey))
                prev_hist[(ref.signal, skey)] = (t_s, cur)
                d = _hist_delta(cur, prev[1] if prev else None, restarted)
                if not d or prev is None:
                    continue
                agg["n"] += 1
                agg["t0"] = min(agg["t0"], prev[0])
                for le, v in d["b"].items():
                    agg["b"][le] += v
                agg["sum"] += d["sum"]
                agg["count"] += d["count"]
            if agg["n"]:
                hist_rows.extend({"t0_s": agg["t0"], "t_s": t_s, "signal": ref.signal, "le": le, "count": c}
                                 for le, c in sorted(agg["b"].items()))
                sum_rows.append({"t0_s": agg["t0"], "t_s": t_s, "signal": ref.signal, "count": agg["count"],
                                 "sum": agg["sum"]})
    if bad_total:
        (ctx or TableContext.defaults()).note(
            f"{bundle.stream_file('metrics') or bundle.path / 'metrics.jsonl'}: skipped {bad_total} "
                    f"malformed sample(s) (not [name, labels, value] with a finite value within 1e18) on "
                    f"{lines_text(sorted(bad_lines))}")
    metrics = pd.DataFrame(rows, columns=[c for c in METRIC_COLUMNS if c not in ("t0_s", "delta")])
    metrics = _add_deltas(metrics, {s["t_s"] for s in scrapes if s["restarted"]})
    stated = bundle.meta.target.settings  # what the engine said about itself (server info, its command line)
    for key in ENGINE_SETTINGS:
        if key in stated:
            config.setdefault(key, float(stated[key]))
    out = {
        "metrics": metrics,
        "metrics_hist": pd.DataFrame(hist_rows, columns=HIST_COLUMNS),
        "metrics_hist_sum": pd.DataFrame(sum_rows, columns=HIST_SUM_COLUMNS),
        "metrics_scrapes": pd.DataFrame(scrapes, columns=["t_s", "scrape_ms", "parse_ms", "samples", "restarted"]),
        "server_config": pd.DataFrame(sorted(config.items()), columns=["key", "value"]),
    }
    return out


# the engine settings that become signals, with their units (engines.VALUE_FLAGS / BOOL_FLAGS spell the flags)
ENGINE_SETTINGS: dict[str, str] = {
    "max_num_seqs": "requests", "max_num_batched_tokens": "tokens", "kv_capacity_tokens": "tokens",
    "kv_block_size_tokens": "tokens", "kv_blocks": "blocks", "prefix_caching": "flag", "chunked_prefill": "flag",
    "cuda_graphs": "flag", "tensor_parallel_size": "ranks", "max_model_len": "tokens", "context_size": "tokens",
    "max_concurrent_requests": "requests", "max_batch_total_tokens": "tokens", "threads": "threads",
    "continuous_batching": "flag", "ubatch_tokens": "tokens", "sampling_top_k": "tokens", "constrained_decoding": "flag",
}


def _add_deltas(df: pd.DataFrame, restarts: set[float]) -> pd.DataFrame:
    df = df.sort_values(["signal", "dp", "t_s"], kind="stable").reset_index(drop=True)
    df["t0_s"] = df.groupby(["signal", "dp"])["t_s"].shift(1)
    df["delta"] = math.nan
    counters = df["kind"] == "counter"
    for _key, g in df[counters].groupby(["signal", "dp"]):
        df.loc[g.index, "delta"] = counter_increments(g["value"].tolist(), [t in restarts for t in g["t_s"]])
    return df[METRIC_COLUMNS]


# --------------------------------------------------------------------------------------------------
_BY_SIGNAL: ContextVar[dict[int, dict[Any, pd.DataFrame]] | None] = ContextVar("prometheus_by_signal", default=None)
# within one :func:`signals` call: each histogram's increase and mean over the window, computed once (one
# histogram gives its P50, P90, P99, tail mean and mean: each read the same two sums)
_MEMO: ContextVar[dict[tuple[Any, ...], Any] | None] = ContextVar("prometheus_memo", default=None)


def _memo(key: tuple[Any, ...], compute: Any) -> Any:
    memo = _MEMO.get()
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]


def _rows(df: pd.DataFrame, signal: str) -> pd.DataFrame:
    """The rows of one signal: from :func:`signals`' split of the table when there is one (same rows, same
    order), else by filtering."""
    split = _BY_SIGNAL.get()
    of = split.get(id(df)) if split is not None else None
    if of is not None:
        return of.get(signal, df.iloc[0:0])
    return df[df["signal"] == signal]


def _overlapping(df: pd.DataFrame, window: Window) -> pd.DataFrame:
    """Scrape intervals (t0_s, t_s] that overlap the window."""
    return df[(df["t_s"] > window.start_s) & (df["t0_s"] < window.end_s)]


def gauge_series(tables: dict[str, pd.DataFrame], signal: str, window: Window | None = None) -> list[tuple[float, float]]:
    """(t_s, value) of one gauge, combined over data-parallel engines (sum, or max for ratios)."""
    df = tables.get("metrics")
    if df is None or df.empty:
        return []
    g = _rows(df, signal)
    g = g[g["kind"] == "gauge"]
    if window is not None:
        g = g[(g["t_s"] >= window.start_s) & (g["t_s"] <= window.end_s)]
    if g.empty:
        return []
    how = "max" if (g["agg"] == "max").any() else "sum"
    s = g.groupby("t_s")["value"].agg(how)
    return [(float(t), float(v)) for t, v in s.items()]


def counter_increase(tables: dict[str, pd.DataFrame], signal: str, window: Window) -> float | None:
    """Increase of one counter over the window (all engines); None when it was never scraped twice."""
    df = tables.get("metrics")
    if df is None or df.empty:
        return None
    c = _rows(df, signal)
    c = _overlapping(c[c["kind"] == "counter"], window)
    d = c["delta"].dropna()
    return float(d.sum()) if len(d) else None


def counter_intervals(tables: dict[str, pd.DataFrame], signal: str, window: Window) -> pd.DataFrame:
    """One counter's increase per scrape interval overlapping the window (data-parallel series added):
    columns ``t0_s, t_s, delta``, in time order."""
    df = tables.get("metrics")
    if df is None or df.empty:
        return pd.DataFrame(columns=["t0_s", "t_s", "delta"])
    c = _overlapping(_rows(df, signal), window)
    c = c[c["kind"] == "counter"].dropna(subset=["delta", "t0_s"])
    return c.groupby(["t0_s", "t_s"], as_index=False)["delta"].sum().sort_values("t_s")


def hist_window(tables: dict[str, pd.DataFrame], signal: str, window: Window) -> tuple[list[float], list[float]]:
    """Bucket upper bounds and cumulative counts of one histogram's increase over the window."""
    df = tables.get("metrics_hist")
    if df is None or df.empty:
        return [], []
    les, cum = _memo(("hist_window", id(df), signal, window.start_s, window.end_s),
                     lambda: _hist_window(df, signal, window))
    return list(les), list(cum)


def _hist_window(df: pd.DataFrame, signal: str, window: Window) -> tuple[list[float], list[float]]:
    h = _overlapping(_rows(df, signal), window)
    if h.empty:
        return [], []
    s = h.groupby("le")["count"].sum().sort_index()
    return [float(x) for x in s.index], [float(x) for x in s.values]


def _with_sum(tables: dict[str, pd.DataFrame], signal: str,
              window: Window) -> tuple[list[float], list[float], float | None]:
    """One histogram's increase over the window: bucket bounds, cumulative counts, and its ``_sum`` when the
    sum covers the same observations as the buckets (else None)."""
    les, cum = hist_window(tables, signal, window)
    mean = hist_mean(tables, signal, window)
    total_sum = mean[0] * mean[1] if mean is not None and mean[1] == (cum[-1] if cum else None) else None
    return les, cum, total_sum


def hist_quantile(tables: dict[str, pd.DataFrame], signal: str, q: float, window: Window) -> QuantileEstimate | None:
    """Quantile of one histogram's observations in the window, its bucket, and the ``_sum`` bound."""
    return histogram_quantile(q, *_with_sum(tables, signal, window))


def hist_tail_mean(tables: dict[str, pd.DataFrame], signal: str, q: float, window: Window) -> TailMean | None:
    """Mean of one histogram's observations above its quantile ``q`` in the window, with the bounds the buckets
    and the ``_sum`` allow (prom_hist.histogram_tail_mean)."""
    return histogram_tail_mean(q, *_with_sum(tables, signal, window))


def hist_mean(tables: dict[str, pd.DataFrame], signal: str, window: Window) -> tuple[float, float] | None:
    """(mean, count) of the observations in the window, from _sum and _count; None when there are none."""
    df = tables.get("metrics_hist_sum")
    if df is None or df.empty:
        return None
    return _memo(("hist_mean", id(df), signal, window.start_s, window.end_s), lambda: _hist_mean(df, signal, window))


def _hist_mean(df: pd.DataFrame, signal: str, window: Window) -> tuple[float, float] | None:
    h = _overlapping(_rows(df, signal), window)
    n = float(h["count"].sum())
    return (float(h["sum"].sum()) / n, n) if n > 0 else None


# Little's law: the mean number of requests in a stage over a window is the time they spent there, summed,
# over the window's length. The per-request histograms' _sum series give that time for the requests that
# finished in each scrape interval.
LITTLES_SOURCES: dict[str, tuple[str, ...]] = {
    "queue_depth": ("queue_time_seconds",),
    "running_requests": ("prefill_time_seconds", "decode_time_seconds"),
}


def littles_mean(tables: dict[str, pd.DataFrame], hists: tuple[str, ...], window: Window
                 ) -> tuple[float, tuple[tuple[float, float], ...], str] | None:
    """(mean, per-interval series, how) of the requests in a stage over the window, from the histogram sums
    of ``hists`` (all must be present): sum of their ``_sum`` increases / the scrape intervals' length.
    None without them or without a completed request in the window."""
    df = tables.get("metrics_hist_sum")
    if df is None or df.empty:
        return None
    per: dict[float, list[float]] = {}
    span: dict[float, float] = {}
    n = 0.0
    for h in hists:
        rows = _overlapping(_rows(df, h), window)
        if rows.empty:
            return None
        n = max(n, float(rows["count"].sum()))
        for t0, t, v in zip(rows["t0_s"], rows["t_s"], rows["sum"], strict=True):
            per.setdefault(float(t), []).append(float(v))
            span[float(t)] = float(t) - float(t0)
    total = sum(span.values())
    if n <= 0 or total <= 0:
        return None
    series = tuple((t, sum(per[t]) / span[t]) for t in sorted(per) if span[t] > 0)
    mean = sum(sum(v) for v in per.values()) / total
    what = (f"summed {' + '.join(h.replace('_seconds', '') for h in hists)} of the {n:.0f} requests that finished in "
            f"{len(series)} scrape intervals / their {total:.1f} s")
    return mean, series, what


HISTOGRAM_SIGNALS: tuple[tuple[str, str, tuple[int, ...], bool, str], ...] = (
    # (table signal, output prefix, percentiles, mean, definition)
    ("ttft_seconds", "server_ttft", (50, 90, 99), True, "server TTFT (engine's own start point)"),
    ("queue_time_seconds", "server_queue_time", (50, 99), True, "server queue time"),
    ("prefill_time_seconds", "server_prefill_time", (50, 99), True, "server prefill time"),
    ("decode_time_seconds", "server_decode_time", (), True, "server decode time per request"),
    ("itl_seconds", "server_itl", (50, 99), False, "server inter-token latency"),
    ("e2e_seconds", "server_e2e", (50, 99), False, "server end-to-end latency"),
)


def _fmt_bound(x: float) -> str:
    return "+Inf" if math.isinf(x) else f"{fmt_value(x * 1e3)} ms"


def without_excluded(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The metric tables without the scrapes that overlap a stretch left out of the statistics (the engine
    profiler's window, table ``client_excluded``): gauges sampled inside it, and counter / histogram increases
    over scrape intervals (t0_s, t_s] that touch it. The profiler slows the engine, so its queue, latency
    histograms and throughput there describe the profiler, not the server."""
    ex = tables.get("client_excluded")
    if ex is None or ex.empty:
        return tables
    bands = [(float(a), float(b)) for a, b in zip(ex["start_s"], ex["end_s"], strict=False)]
    out = dict(tables)
    for name in ("metrics", "metrics_hist", "metrics_hist_sum"):
        df = out.get(name)
        if df is None or df.empty:
            continue
        t = df["t_s"].to_numpy(float)
        t0 = df["t0_s"].to_numpy(float)
        t0 = np.where(np.isfinite(t0), t0, t)  # the first scrape has no interval: its own time
        keep = np.ones(len(df), dtype=bool)
        for a, b in bands:
            keep &= ~((t >= a) & (t0 <= b))
        out[name] = df[keep]
    return out


def signals(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    if "metrics" not in tables:
        return []
    tables = without_excluded(tables)
    # each metric table split by signal once per call: the helpers below look one signal up many times
    split = {id(df): dict(tuple(df.groupby("signal", sort=False))) for name in ("metrics", "metrics_hist",
             "metrics_hist_sum") if (df := tables.get(name)) is not None and not df.empty}
    token, memo = _BY_SIGNAL.set(split), _MEMO.set({})
    try:
        return _signals(tables, window)
    finally:
        _MEMO.reset(memo)
        _BY_SIGNAL.reset(token)


def window_coverage(tables: dict[str, pd.DataFrame], window: Window) -> tuple[float, float, float] | None:
    """(share of the window between the first and the last scrape, first, last scrape time); None without
    scrapes or when the window holds nothing. The window is first clipped to what the capture holds (the
    scrapes and the client's requests, sent to done): a window wider than the capture is not uncovered."""
    df = tables.get("metrics_scrapes")
    if df is None or df.empty:
        df = tables["metrics"]
    t = df["t_s"].to_numpy(float)
    t = t[np.isfinite(t)]
    if not len(t):
        return None
    first, last = float(t.min()), float(t.max())
    lo, hi = first, last
    req = tables.get("requests")
    if req is not None and len(req) and {"sent_s", "end_s"} <= set(req.columns):
        ends = np.concatenate([req["sent_s"].to_numpy(float), req["end_s"].to_numpy(float)])
        ends = ends[np.isfinite(ends)]
        if len(ends):
            lo, hi = min(lo, float(ends.min())), max(hi, float(ends.max()))
    start, end = max(window.start_s, lo), min(window.end_s, hi)
    if not end > start:
        return None
    return max(0.0, min(1.0, (min(last, end) - max(first, start)) / (end - start))), first, last


def _signals(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    out: list[Signal] = []
    engine = str(tables["metrics"]["engine"].iloc[0]) if len(tables["metrics"]) else "unknown"
    cov = window_coverage(tables, window)
    if cov is not None:
        share, first, last = cov
        out.append(Signal("metrics_window_coverage_ratio", share, "ratio", SOURCE,
                          f"share of the window {window.start_s:.1f}-{window.end_s:.1f} s that lies between the "
                          f"first and the last metrics scrape ({first:.1f}-{last:.1f} s)"))
        if share < MIN_WINDOW_COVERAGE:
            return out + _served_signal(tables, engine)
    littles: dict[str, float] = {}  # the time-weighted means by Little's law, for the in-flight split below
    for sig, name, unit in (("queue_depth", "queue_depth", ""), ("running_requests", "running_requests", ""),
                            ("kv_usage_ratio", "kv_usage", "_ratio")):
        pts = gauge_series(tables, sig, window)
        little = littles_mean(tables, LITTLES_SOURCES[sig], window) if sig in LITTLES_SOURCES else None
        if little is not None:
            littles[sig] = little[0]
            # the gauge is the scheduler's state at the step before the scrape (vLLM reads 0 running between
            # steps while 14 wait); the histogram sums give the time-weighted mean over the window
            lmean, lseries, lwhat = little
            out.append(Signal(f"{name}_mean", lmean, "requests", SOURCE,
                              f"{engine} {sig}, time-weighted mean by Little's law: {lwhat}", lseries))
        if pts:
            vals = [v for _, v in pts]
            series = tuple(pts)
            u = "ratio" if unit else "requests"
            if little is None:
                out.append(Signal(f"{name}_mean{unit}", sum(vals) / len(vals), u, SOURCE,
                                  f"{engine} {sig}, mean of {len(vals)} scrapes", series))
            out.append(Signal(f"{name}_max{unit}", max(vals), u, SOURCE, f"{engine} {sig}, max over scrapes", series))
    for sig, name, unit in (("preemptions", "preemptions_total", "events"),
                            ("rejected_requests", "rejected_requests_total", "requests")):
        inc = counter_increase(tables, sig, window)
        if inc is not None:
            out.append(Signal(name, inc, unit, SOURCE, f"{engine} {sig} counter increase over the window"))
    queries = counter_increase(tables, "prefix_cache_queries_tokens", window)
    hits = counter_increase(tables, "prefix_cache_hits_tokens", window)
    if queries and hits is not None:
        out.append(Signal("prefix_cache_hit_ratio", hits / queries, "ratio", SOURCE,
                          f"prefix-cache hit tokens / queried tokens ({hits:.0f} / {queries:.0f})"))
    out.extend(_rate_signals(tables, window))
    out.extend(_served_signal(tables, engine))
    for sig, prefix, pcts, want_mean, what in HISTOGRAM_SIGNALS:
        for p in pcts:
            est = hist_quantile(tables, sig, p / 100, window)
            if est is None:
                continue
            desc = (f"{what} P{p} from the histogram of {est.count:.0f} observations: linear interpolation "
                    f"in bucket ({_fmt_bound(est.lo)}, {_fmt_bound(est.hi)}]")
            if est.bound < est.hi:
                desc += f", provably <= {_fmt_bound(est.bound)} from the histogram sum"
            out.append(Signal(f"{prefix}_p{p}_ms", est.value * 1e3, "ms", SOURCE, desc))
            out.append(Signal(f"{prefix}_p{p}_bucket_lo_ms", est.lo * 1e3, "ms", SOURCE, f"lower bound of {desc}"))
            if math.isfinite(est.hi):
                out.append(Signal(f"{prefix}_p{p}_bucket_hi_ms", est.hi * 1e3, "ms", SOURCE, f"upper bound of {desc}"))
        mean = hist_mean(tables, sig, window)
        if want_mean and mean is not None:
            out.append(Signal(f"{prefix}_mean_ms", mean[0] * 1e3, "ms", SOURCE,
                              f"{what} mean of {mean[1]:.0f} observations (_sum / _count)"))
    names = {s.name: s for s in out}
    if "server_queue_time_mean_ms" in names and names.get("server_ttft_mean_ms") and names["server_ttft_mean_ms"].value > 0:
        share = names["server_queue_time_mean_ms"].value / names["server_ttft_mean_ms"].value
        out.append(Signal("server_queue_share_of_ttft_ratio", share, "ratio", SOURCE,
                          "server mean queue time / server mean TTFT"))
    elif "server_queue_time_mean_ms" not in names and "queue_depth_mean" in names:
        out.extend(_littles_queue_time(tables, window, names["queue_depth_mean"].value, engine))
    step = hist_mean(tables, "batch_tokens_per_step", window)
    if step is not None:
        out.append(Signal("batch_tokens_per_step_mean", step[0], "tokens", SOURCE,
                          f"prompt + generation tokens per output step, mean of {step[1]:.0f} steps (vLLM counts a prompt "
                          "whole in the step that gives its first token, so this does not show prefill chunks)"))
    client_ttft = client_ttft_s(tables, window)
    queue, prefill = hist_mean(tables, "queue_time_seconds", window), hist_mean(tables, "prefill_time_seconds", window)
    if client_ttft and queue is not None and prefill is not None:
        total = sum(client_ttft) / len(client_ttft)
        if total > 0:
            note = (f"of the client's mean TTFT ({total * 1e3:.0f} ms, {len(client_ttft)} requests), from the server's "
                    "histogram sums (exact means over the requests finished in the window's scrape intervals)")
            q, pf = min(1.0, queue[0] / total), min(1.0, prefill[0] / total)
            out.append(Signal("server_ttft_split_queue_ratio", q, "ratio", SOURCE, f"queue time's share {note}"))
            out.append(Signal("server_ttft_split_prefill_ratio", pf, "ratio", SOURCE, f"prefill's share {note}"))
            out.append(Signal("server_ttft_split_engine_ratio", min(1.0, q + pf), "ratio", SOURCE,
                              f"time in the engine (queue + prefill)'s share {note}"))
            out.append(Signal("server_ttft_split_outside_ratio", max(0.0, 1.0 - q - pf), "ratio", SOURCE,
                              f"the rest (API server, network, client): 1 - queue - prefill, {note}"))
    req = tables.get("requests")
    client = (in_flight_mean(select(req, window).counted, tables.get("client_excluded"))
              if req is not None and not req.empty and {"sent_s", "end_s"} <= set(req.columns) else None)
    if client is not None and len(littles) == len(LITTLES_SOURCES):
        # the cross-layer check of where in-flight requests are, every term time-weighted by Little's law
        waiting, running = littles["queue_depth"], littles["running_requests"]
        outside = client - waiting - running
        how = (f"client in flight {client:.1f} - engine waiting {waiting:.1f} - engine running {running:.1f}, all "
               "time-weighted (Little's law)")
        out.append(Signal("api_server_in_flight_mean", max(0.0, outside), "requests", SOURCE,
                          f"requests in flight outside the engine's queue and batch (API server: HTTP, tokenise, "
                          f"detokenise, stream; and the network): {how}" + (
                              f"; the difference is {outside:.2f}, below zero by the error of the histogram sums "
                              "(counted when requests finish), shown as 0" if outside < 0 else "")))
        if client > 0:
            out.append(Signal("api_server_in_flight_share_ratio", max(0.0, outside) / client, "ratio", SOURCE,
                              f"share of the client's in-flight requests that are outside the engine: {how}"))
    gap = ttft_gap(tables, window)
    if gap is not None:
        out.append(Signal("server_ttft_client_gap_mean_ms", gap[0], "ms", SOURCE,
                          f"client mean TTFT - server mean TTFT ({gap[1]:.0f} client requests): time outside the "
                          "engine's TTFT interval (HTTP, frontend before arrival, detokenize, SSE, network)"))
        if gap[2] > 0:  # the same gap as a share of the client's mean TTFT (issue 34: time outside the server)
            out.append(Signal("server_ttft_client_gap_share_ratio", min(1.0, max(0.0, gap[0] / gap[2])), "ratio",
                              SOURCE, SIGNALS["server_ttft_client_gap_share_ratio"]))
    cfg = tables.get("server_config")
    if cfg is not None:
        for key, value in zip(cfg["key"], cfg["value"], strict=True):
            if key in ENGINE_SETTINGS:
                out.append(Signal(str(key), float(value), ENGINE_SETTINGS[key], SOURCE, "engine setting"))
    return out


def _rate_signals(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    out: list[Signal] = []
    df = tables["metrics"]
    for sig, name, unit, desc in (("generation_tokens", "server_output_tps", "tokens/s", "generated tokens per second"),
                                  ("process_cpu_seconds", "server_process_cpu_ratio", "cores",
                                   "API-server process CPU time per second (1.0 = one core busy)")):
        c = _rows(df, sig)
        c = _overlapping(c[c["kind"] == "counter"], window).dropna(subset=["delta"])
        span = float((c["t_s"] - c["t0_s"]).groupby(c["dp"]).sum().max()) if len(c) else 0.0
        if span > 0:
            out.append(Signal(name, float(c["delta"].sum()) / span, unit, SOURCE, f"server {desc} (counter rate)"))
    return out


def _served_signal(tables: dict[str, pd.DataFrame], engine: str) -> list[Signal]:
    served = _served_before_capture(tables)
    if served is None:
        return []
    return [Signal("server_requests_before_capture", served, "requests", SOURCE,
                   f"{engine} finished-requests counter at the capture's first scrape: requests the server "
                   "had served since it started, before this capture (0: a cold server)")]


def _served_before_capture(tables: dict[str, pd.DataFrame]) -> float | None:
    """The finished-requests counter (all series summed) at the capture's first scrape; None without it.
    The same for every window of a run: it describes the server's state when the capture began."""
    df = tables.get("metrics")
    if df is None or df.empty:
        return None
    c = _rows(df, "finished_requests")
    c = c[c["kind"] == "counter"]
    if c.empty:
        return None
    first = float(c["t_s"].min())
    return float(c.loc[c["t_s"] == first, "value"].sum())


def _littles_queue_time(tables: dict[str, pd.DataFrame], window: Window, waiting: float, engine: str
                        ) -> list[Signal]:
    """An engine with a queue gauge but no queue-time histogram (llama.cpp: requests deferred for want of a
    free slot): the mean wait by Little's law, W = L / lambda, L the gauge's mean over the scrapes and lambda
    the rate at which the client's requests finished, and its share of the client's mean TTFT."""
    req = tables.get("requests")
    if req is None or req.empty or not {"sent_s", "end_s"} <= set(req.columns):
        return []
    sel = select(req, window)
    span = span_s(sel.counted, tables.get("client_excluded"))
    if not len(sel.done) or not span > 0:
        return []
    rate = len(sel.done) / span
    wait_s = waiting / rate
    how = (f"Little's law: {engine} requests waiting, mean of the scrapes ({waiting:.2f}) / the rate the client's "
           f"requests finished ({rate:.2f}/s, {len(sel.done)} in {span:.1f} s); the engine has no queue-time histogram")
    out = [Signal("server_queue_time_mean_ms", wait_s * 1e3, "ms", SOURCE, f"server queue time, mean by {how}")]
    ttft = client_ttft_s(tables, window)
    if ttft and sum(ttft) > 0:
        mean = sum(ttft) / len(ttft)
        out.append(Signal("server_queue_share_of_ttft_ratio", min(1.0, wait_s / mean), "ratio", SOURCE,
                          f"server mean queue time / the client's mean TTFT ({mean * 1e3:.0f} ms); queue time by {how}"))
    return out


def client_ttft_s(tables: dict[str, pd.DataFrame], window: Window) -> list[float]:
    """TTFTs (s) of the window's measured, successful client requests (diagnose.requests.select)."""
    req = tables.get("requests")
    if req is None or req.empty or not {"ok", "ttft_ms", "sent_s"} <= set(req.columns):
        return []
    return [float(v) / 1e3 for v in finite(select(req, window).ok["ttft_ms"])]


def ttft_gap(tables: dict[str, pd.DataFrame], window: Window) -> tuple[float, int, float] | None:
    """(client mean TTFT - server mean TTFT in ms, client count, client mean TTFT in ms), when both sides have
    observations."""
    client = client_ttft_s(tables, window)
    server = hist_mean(tables, "ttft_seconds", window)
    if not client or server is None:
        return None
    mean = sum(client) / len(client)
    return (mean - server[0]) * 1e3, len(client), mean * 1e3
