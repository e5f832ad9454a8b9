"""Read a fleet from a Prometheus-compatible query API into a bundle.

Steps (each one a few API calls, whatever the fleet's size):
1. which metric names the selector finds in the window (``/api/v1/label/__name__/values``) -> the engine;
2. per-replica totals over the window, evaluated on the server at its end (increase, histogram_quantile,
   changes/resets of the start time and counters, samples per series -> the scrape interval);
3. per-replica series at a coarse step (sums by replica of the load gauges, rate() of the counters);
4. the replicas that matter (busiest, idlest, fullest KV cache, highest queue, restarted, prefix-cache
   outliers; at most ``detail_max``) pulled at full resolution: every engine-map series of that replica.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from diagnose.engines.detect import ENGINE_PREFIXES, engine_from_metric_names
from diagnose.errors import TargetError
from diagnose.fleet.queries import REPLICA_LABELS, FleetQueries, replica_key, replica_name
from diagnose.io.writer import BundleWriter, utc_iso
from diagnose.model import ProbeStatus
from diagnose.probes.prometheus_api import VALUE_ABS_MAX, PrometheusAPI

RANGE_POINTS = 240  # points per replica series of the aggregated range queries
DETAIL_MAX = 4
# The physical range of each aggregated quantity (base units, after the engine map's scale); a value outside
# it (a KV usage ratio of 1e308, a negative queue) is skipped and counted, like NaN and Inf.
_COUNT_MAX = 1e7  # requests in flight or waiting on one replica
_TOTAL_MAX = 1e15  # requests, tokens or events over a window
_SECONDS_MAX = 1e6  # a latency
RANGES: dict[str, tuple[float, float]] = {
    "kv_usage": (0.0, 1.0), "running": (0.0, _COUNT_MAX), "waiting": (0.0, _COUNT_MAX),
    "in_flight": (0.0, _COUNT_MAX), "waiting_littles": (0.0, _COUNT_MAX), "request_rate": (0.0, _TOTAL_MAX),
    "output_tps": (0.0, _TOTAL_MAX), "requests": (0.0, _TOTAL_MAX), "generation_tokens": (0.0, _TOTAL_MAX),
    "prefix_queries": (0.0, _TOTAL_MAX), "prefix_hits": (0.0, _TOTAL_MAX), "preemptions": (0.0, _TOTAL_MAX),
    "ttft_p50_s": (0.0, _SECONDS_MAX), "ttft_p99_s": (0.0, _SECONDS_MAX), "queue_time_mean_s": (0.0, _SECONDS_MAX),
    "start_time_changes": (0.0, _TOTAL_MAX), "counter_resets": (0.0, _TOTAL_MAX), "samples": (0.0, _TOTAL_MAX),
}
RATIO_SLACK = 1e-6  # a ratio of 1 + rounding is still 1


@dataclass(frozen=True)
class FleetWindow:
    start_s: float  # unix seconds
    end_s: float

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


Key = tuple[tuple[str, str], ...]


async def discover(api: PrometheusAPI, selector: str | None, win: FleetWindow) -> tuple[str, FleetQueries]:
    """The engine and the queries for it; a one-line error when the selector finds nothing to read."""
    probe = FleetQueries("unknown", (), selector)  # checks the selector before anything is asked
    match = f"{{{probe.matchers}}}" if probe.matchers else '{__name__=~".+"}'
    names = await api.label_values("__name__", match, win.start_s, win.end_s)
    shown = selector or "(no selector)"
    if not names:
        raise TargetError(f"--selector {shown}: matches no series at {api.url} between {utc_iso(int(win.start_s * 1e9))}"
                          f" and {utc_iso(int(win.end_s * 1e9))}")
    engine = engine_from_metric_names(names)
    if engine is None:
        prefixes = ", ".join(p for ps in ENGINE_PREFIXES.values() for p in ps)
        raise TargetError(f"--selector {shown}: {len(names)} metric names at {api.url}, none an engine's "
                          f"({prefixes})")
    return engine, FleetQueries(engine, names, selector)


async def capture_fleet(api: PrometheusAPI, selector: str | None, win: FleetWindow, bundle: BundleWriter, *,
                        detail_max: int = DETAIL_MAX, log: Callable[[str], None] = lambda _m: None) -> ProbeStatus:
    """Query the fleet over ``win`` and write its streams into ``bundle`` (whose clock is anchored at the
    window's start: ``t_ns`` = anchor + seconds since the start). Returns the ``fleet`` probe status."""
    engine, fq = await discover(api, selector, win)
    step = max(1.0, math.ceil(win.length_s / RANGE_POINTS))
    t_range = (win.start_s - max(86400.0, win.length_s), win.end_s + 86400.0)  # a time beyond it is malformed
    totals: dict[str, dict[Key, float]] = {}
    for q in fq.total_queries(win.length_s):
        res = await api.query(q.promql, win.end_s)
        lo, hi = _range(q.key)
        totals[q.key] = {replica_key(r["metric"]): x[1] for r in res
                         if (x := api.point(r.get("value"), q.scale, lo, hi, t_range)) is not None}
    samples = [v for v in totals.get("samples", {}).values() if v > 1]
    # the scrape interval, from the samples each replica's load gauge has in the window
    interval = max(0.5, min(win.length_s / (v - 1) for v in samples)) if samples else 15.0
    rate_window = max(4 * interval, 2 * step)
    series: dict[str, dict[Key, list[tuple[float, float]]]] = {}
    for q in fq.range_queries(rate_window):
        res = await api.query_range(q.promql, win.start_s, win.end_s, step)
        lo, hi = _range(q.key)
        series[q.key] = {k: pts for r in res
                         if (pts := api.points(r, scale=q.scale, lo=lo, hi=hi, t_range=t_range))
                         and (k := replica_key(r["metric"]))}
    replicas = sorted({k for d in totals.values() for k in d if k} | {k for s in series.values() for k in s if k})
    if not replicas and not api.tally.usable and api.tally.skipped:
        raise TargetError(f"--selector {selector or '(no selector)'}: no usable value at {api.url} in the "
                          f"{win.length_s:.0f} s window: the values Prometheus returned were "
                          f"{api.tally.describe()}")
    if not replicas:
        raise TargetError(f"--selector {selector or '(no selector)'}: no engine series with any of the replica labels "
                          f"({', '.join(REPLICA_LABELS)}) at {api.url} in the {win.length_s:.0f} s window (a window "
                          "shorter than two scrape intervals has no rate or increase)")
    ids = {k: f"r{i}" for i, k in enumerate(replicas)}
    why = pick_detail(replicas, totals, series, detail_max)
    rep_stream = bundle.stream("fleet_replicas", "one record per replica: its labels and why it was pulled whole")
    for k in replicas:
        rep_stream.write({"replica": ids[k], "name": replica_name(k), "labels": dict(k), "detail": k in why,
                          "why": why.get(k, [])})
    to_ns = _clock(bundle, win)
    ser_stream = bundle.stream("fleet_series", "per-replica series aggregated by the server (one per query x replica)")
    for key, by_rep in sorted(series.items()):
        for k, pts in sorted(by_rep.items()):
            if k in ids:
                ser_stream.write({"query": key, "replica": ids[k], "t_ns": [to_ns(t) for t, _ in pts],
                                  "value": [v for _, v in pts]})
    tot_stream = bundle.stream("fleet_totals", "per-replica values over the whole window (instant queries at its end)")
    for key, tot in sorted(totals.items()):
        for k, v in sorted(tot.items()):
            if k in ids:
                tot_stream.write({"query": key, "replica": ids[k], "value": v})
    detail_points = 0
    ratios = fq.ratio_ranges(RATIO_SLACK)  # wire names of ratios (a KV cache usage): their raw range
    det_stream = bundle.stream("fleet_metrics", "full-resolution engine metrics of the replicas that matter, one "
                                                "record per replica x scrape (the metrics stream's sample shape)")
    for k in replicas:
        if k not in why:
            continue
        sel = fq.detail_selector(dict(k))
        if sel is None:
            continue
        res = await api.query_range(sel, win.start_s, win.end_s, interval)
        by_t: dict[float, list[list[Any]]] = defaultdict(list)
        renames = fq.counter_renames()
        for r in res:
            labels = {a: b for a, b in r["metric"].items() if a != "__name__"}
            name = r["metric"].get("__name__", "")
            name = renames.get(name, name)
            lo, hi = ratios.get(name, (-VALUE_ABS_MAX, VALUE_ABS_MAX))
            for t, v in api.points(r, lo=lo, hi=hi, t_range=t_range):
                by_t[t].append([name, labels, v])
        for t in sorted(by_t):
            det_stream.write({"replica": ids[k], "t_ns": to_ns(t), "samples": by_t[t]})
            detail_points += 1
    q_stream = bundle.stream("fleet_queries", "every API call made, with its status, time and size")
    q_stream.write_many(api.log.entries)
    options = {"prometheus": api.url, "selector": selector or "", "engine": engine, "start_unix_s": win.start_s,
               "end_unix_s": win.end_s, "step_s": step, "scrape_interval_s": round(interval, 3),
               "rate_window_s": rate_window, "replica_labels": list(REPLICA_LABELS), "detail_max": detail_max}
    bundle.update("options", {"fleet": options})
    detail = {"replicas": len(replicas), "detail_replicas": len(why), "detail_scrapes": detail_points,
              "api_calls": len(api.log.entries), "engine": engine, "values": api.tally.usable,
              "dropped": api.tally.to_json()}
    log(f"fleet: {len(replicas)} replicas ({engine}), {len(why)} pulled at full resolution, "
        f"{len(api.log.entries)} API calls")
    reason = ""
    if api.tally.skipped:
        reason = f"dropped {api.tally.skipped} of the values Prometheus returned: {api.tally.describe()}"
        log(f"warning: fleet: {reason}")
    return ProbeStatus("fleet", "ok", reason, detail)


def pick_detail(replicas: list[Key], totals: dict[str, dict[Key, float]],
                series: dict[str, dict[Key, list[tuple[float, float]]]], n: int) -> dict[Key, list[str]]:
    """The replicas worth pulling whole, each with why: extremes of load, queue, KV usage and prefix-cache hit
    rate, and any that restarted; at most ``n`` (the first reasons win)."""
    def mean(key: str, k: Key) -> float:
        vals = [v for _, v in series.get(key, {}).get(k, []) if math.isfinite(v)]
        return sum(vals) / len(vals) if vals else math.nan

    def peak(key: str, k: Key) -> float:
        vals = [v for _, v in series.get(key, {}).get(k, []) if math.isfinite(v)]
        return max(vals) if vals else math.nan

    load = {k: v if math.isfinite(v := mean("in_flight", k)) else _nan0(mean("running", k)) + _nan0(mean("waiting", k))
            for k in replicas}
    hits = {k: totals.get("prefix_hits", {}).get(k, math.nan) / q
            for k in replicas if (q := totals.get("prefix_queries", {}).get(k, 0.0)) and q > 0}
    candidates: list[tuple[str, dict[Key, float], bool]] = [
        ("busiest", load, True),
        ("most queued", {k: v if math.isfinite(v := mean("waiting_littles", k)) else mean("waiting", k)
                         for k in replicas}, True),
        ("fullest KV cache", {k: peak("kv_usage", k) for k in replicas}, True),
        ("restarted", {k: max(_nan0(totals.get("start_time_changes", {}).get(k, math.nan)),
                              _nan0(totals.get("counter_resets", {}).get(k, math.nan))) for k in replicas}, True),
        ("idlest", load, False), ("highest prefix-cache hit rate", hits, True),
        ("lowest prefix-cache hit rate", hits, False),
    ]
    out: dict[Key, list[str]] = {}
    for reason, vals, high in candidates:
        finite = {k: v for k, v in vals.items() if math.isfinite(v)}
        if not finite or max(finite.values()) == min(finite.values()) and (len(finite) > 1 or reason == "restarted"):
            continue  # no extreme: every replica reads the same (no queue anywhere, no restart)
        if reason == "restarted" and max(finite.values()) <= 0:
            continue
        best = (max if high else min)(finite, key=lambda k: (finite[k], k))
        if best in out:
            out[best].append(reason)
        elif len(out) < n:
            out[best] = [reason]
    return out


def _nan0(v: float) -> float:
    return v if math.isfinite(v) else 0.0


def _range(key: str) -> tuple[float, float]:
    lo, hi = RANGES.get(key, (-VALUE_ABS_MAX, VALUE_ABS_MAX))
    return lo, hi * (1 + RATIO_SLACK) if hi == 1.0 else hi


def _clock(bundle: BundleWriter, win: FleetWindow) -> Callable[[float], int]:
    """Anchor the bundle's clock at the window's start, so t_s = seconds since it (the capture's time base),
    and return unix seconds -> the bundle's monotonic ns."""
    start_ns = int(win.start_s * 1e9)
    mono = time.monotonic_ns() - (time.time_ns() - start_ns)
    bundle.anchor_unix_ns, bundle.anchor_mono_ns = start_ns, mono
    bundle.update("capture", {"clock_anchor": {"unix_ns": start_ns, "monotonic_ns": mono},
                              "started_unix_ns": start_ns, "started_at": utc_iso(start_ns)})
    return lambda t: mono + int(round(t * 1e9)) - start_ns
