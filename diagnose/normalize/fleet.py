"""Fleet streams (``fleet_replicas``, ``fleet_series``, ``fleet_totals``, ``fleet_metrics``; docs/fleet.md)
-> tables and fleet signals.

Tables:
* ``fleet_replicas``: one row per replica: ``replica, name, labels, detail, why`` and its figures over the
  window: ``load_mean`` (requests in flight: Little's law, the rate of the e2e latency histogram's _sum;
  running + waiting gauges for an engine without one), ``running_mean``, ``waiting_mean`` (Little's law on
  the queue-time histogram when there is one), ``waiting_max``,
  ``kv_mean_ratio``, ``kv_max_ratio``, ``request_rps``, ``output_tps`` (means of the server's per-replica
  series), ``requests``, ``prefix_hit_ratio``, ``ttft_p50_ms``, ``ttft_p99_ms``, ``queue_time_mean_ms``,
  ``preemptions``, ``restarts`` (process start time changes or counter resets), ``samples``.
* ``fleet_series``: ``t_s, replica, name, query, value`` (the aggregated series, one point per step).
* ``fleet_detail``: the replicas pulled at full resolution, normalised exactly like one server's scrapes
  (diagnose/normalize/prometheus.py ``metrics`` table) with a ``replica`` and ``name`` column.

Signals name the replica they are about in their description (``label.<signal>`` in a rule's text).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypedDict

import pandas as pd

from diagnose.analysis import Window
from diagnose.io.bundle import Bundle, MemoryBundle
from diagnose.model import Signal, Source
from diagnose.normalize import TableContext, prometheus

SOURCE: Source = "server"
REPLICA_COLUMNS = ["replica", "name", "labels", "detail", "why", "load_mean", "running_mean", "waiting_mean",
                   "waiting_max", "kv_mean_ratio", "kv_max_ratio", "request_rps", "output_tps", "requests",
                   "prefix_hit_ratio", "ttft_p50_ms", "ttft_p99_ms", "queue_time_mean_ms", "preemptions", "restarts",
                   "samples"]
SERIES_COLUMNS = ["t_s", "replica", "name", "query", "value"]


def _f(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


class SeriesRow(TypedDict):
    """A row of ``fleet_series``: one point of one replica's query."""

    t_s: float
    replica: str
    name: str
    query: str
    value: float


def tables(bundle: Bundle, ctx: TableContext | None = None) -> dict[str, pd.DataFrame]:
    reps = [r for r in bundle.iter_records("fleet_replicas") if isinstance(r.get("replica"), str)]
    if not reps:
        return {}
    anchor = bundle.anchor_mono_ns
    names = {r["replica"]: str(r.get("name") or r["replica"]) for r in reps}
    rows: list[SeriesRow] = []
    for rec in bundle.iter_records("fleet_series"):
        rid, ts, vs = rec.get("replica"), rec.get("t_ns"), rec.get("value")
        if rid not in names or not isinstance(ts, list) or not isinstance(vs, list) or len(ts) != len(vs):
            continue
        rows.extend({"t_s": (int(t) - anchor) / 1e9, "replica": str(rid), "name": names[rid], "query": str(rec.get("query")),
                     "value": _f(v)} for t, v in zip(ts, vs, strict=True) if isinstance(t, int))
    series = pd.DataFrame(rows, columns=SERIES_COLUMNS)
    totals: dict[tuple[str, str], float] = {}
    for rec in bundle.iter_records("fleet_totals"):
        if rec.get("replica") in names:
            totals[(str(rec.get("query")), str(rec["replica"]))] = _f(rec.get("value"))
    return {"fleet_replicas": replica_table(reps, series, totals), "fleet_series": series,
            "fleet_detail": _detail(bundle, names)}


def _mean(series: pd.DataFrame, query: str, rid: str, how: str = "mean") -> float:
    v = series[(series["query"] == query) & (series["replica"] == rid)]["value"].dropna()
    return float(v.agg(how)) if len(v) else math.nan


def replica_table(reps: list[dict[str, Any]], series: pd.DataFrame, totals: dict[tuple[str, str], float]
                  ) -> pd.DataFrame:
    """One row per replica over the series given (a window's points) and the window's totals."""
    out = []
    for r in reps:
        rid = r["replica"]
        running, waiting = _mean(series, "running", rid), _mean(series, "waiting_littles", rid)
        if not math.isfinite(waiting):
            waiting = _mean(series, "waiting", rid)
        littles = _mean(series, "in_flight", rid)
        queries, hits = totals.get(("prefix_queries", rid), math.nan), totals.get(("prefix_hits", rid), math.nan)
        restarts = [v for k in ("start_time_changes", "counter_resets") if math.isfinite(v := totals.get((k, rid), math.nan))]
        raw = r.get("labels")
        labels: Mapping[object, object] = raw if isinstance(raw, dict) else {}
        out.append({
            "replica": rid, "name": str(r.get("name") or rid),
            "labels": ",".join(f"{k}={v}" for k, v in labels.items()),
            "detail": bool(r.get("detail")), "why": ", ".join(str(x) for x in r.get("why") or []),
            "load_mean": littles if math.isfinite(littles) else (
                (running if math.isfinite(running) else 0.0) + (waiting if math.isfinite(waiting) else 0.0)
                if math.isfinite(running) or math.isfinite(waiting) else math.nan),
            "running_mean": running, "waiting_mean": waiting, "waiting_max": _mean(series, "waiting", rid, "max"),
            "kv_mean_ratio": _mean(series, "kv_usage", rid), "kv_max_ratio": _mean(series, "kv_usage", rid, "max"),
            "request_rps": _mean(series, "request_rate", rid), "output_tps": _mean(series, "output_tps", rid),
            "requests": totals.get(("requests", rid), math.nan),
            "prefix_hit_ratio": hits / queries if math.isfinite(queries) and queries > 0 else math.nan,
            "ttft_p50_ms": totals.get(("ttft_p50_s", rid), math.nan) * 1e3,
            "ttft_p99_ms": totals.get(("ttft_p99_s", rid), math.nan) * 1e3,
            "queue_time_mean_ms": totals.get(("queue_time_mean_s", rid), math.nan) * 1e3,
            "preemptions": totals.get(("preemptions", rid), math.nan),
            "restarts": max(restarts) if restarts else math.nan,
            "samples": totals.get(("samples", rid), math.nan),
        })
    return pd.DataFrame(out, columns=REPLICA_COLUMNS)


def _detail(bundle: Bundle, names: dict[str, str]) -> pd.DataFrame:
    """The full-resolution replicas through the one-server normaliser, one replica at a time."""
    by_rep: dict[str, list[dict[str, Any]]] = {}
    for rec in bundle.iter_records("fleet_metrics"):
        if rec.get("replica") in names and isinstance(rec.get("t_ns"), int):
            by_rep.setdefault(str(rec["replica"]), []).append(rec)
    frames = []
    for rid, recs in sorted(by_rep.items()):
        one = MemoryBundle(path=bundle.path, manifest=bundle.manifest, kind="fleet-replica", streams={"metrics": recs})
        t = prometheus.tables(one).get("metrics")
        if t is not None and not t.empty:
            frames.append(t.assign(replica=rid, name=names[rid]))
        bundle.warnings.extend(w.replace(str(bundle.path), f"{bundle.path} replica {names[rid]}") for w in one.warnings)
    cols = [*prometheus.METRIC_COLUMNS, "replica", "name"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def load_points(series: pd.DataFrame, name: str) -> list[tuple[float, float]]:
    """(t_s, requests in flight) of one replica: Little's law on its e2e histogram sum when the engine has
    one, else its running + waiting gauges."""
    one = series[series["name"] == name]
    lit = one[one["query"] == "in_flight"]
    pts = lit if len(lit) else one[one["query"].isin(["running", "waiting"])]
    return [(float(t), float(v)) for t, v in pts.groupby("t_s")["value"].sum(min_count=1).dropna().items()]


# --------------------------------------------------------------------------------------------------
def _pick(df: pd.DataFrame, col: str, high: bool) -> tuple[str, float] | None:
    d = df[["name", col]].dropna()
    if d.empty:
        return None
    d = d.sort_values([col, "name"], ascending=[not high, True])
    return str(d["name"].iloc[0]), float(d[col].iloc[0])


def signals(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    reps = tables.get("fleet_replicas")
    series = tables.get("fleet_series")
    if reps is None or reps.empty or series is None:
        return []
    sub = series[(series["t_s"] >= window.start_s) & (series["t_s"] <= window.end_s)]
    if len(sub) < len(series):  # a narrower window than the capture's: recompute the series means over it
        cols = ["load_mean", "running_mean", "waiting_mean", "waiting_max", "kv_mean_ratio", "kv_max_ratio",
                "request_rps", "output_tps"]
        redo = replica_table([{"replica": r, "name": n} for r, n in zip(reps["replica"], reps["name"], strict=True)],
                             sub, {})
        reps = reps.assign(**{c: redo[c].to_numpy() for c in cols})
    n = len(reps)
    out = [Signal("fleet_replicas", float(n), "replicas", SOURCE,
                  f"replicas the selector found: {', '.join(map(str, reps['name']))}")]
    load = reps["load_mean"].dropna()
    if len(load):
        mean = float(load.mean())
        busy, idle = _pick(reps, "load_mean", True), _pick(reps, "load_mean", False)
        assert busy is not None and idle is not None
        busy_series = tuple(load_points(sub, busy[0]))
        out += [Signal("fleet_load_mean", mean, "requests", SOURCE,
                       f"mean over {len(load)} replicas of each one's mean requests in flight"),
                Signal("fleet_load_busiest_mean", busy[1], "requests", SOURCE, busy[0], busy_series),
                Signal("fleet_load_idlest_mean", idle[1], "requests", SOURCE, idle[0])]
        if mean > 0:
            out.append(Signal("fleet_load_imbalance_ratio", busy[1] / mean, "ratio", SOURCE,
                              f"{busy[0]}: busiest replica's mean requests in flight / the fleet's mean"))
    rps = reps["request_rps"].dropna()
    top = _pick(reps, "request_rps", True)
    if len(rps) and top is not None and float(rps.mean()) > 0:
        out.append(Signal("fleet_request_rate_imbalance_ratio", top[1] / float(rps.mean()), "ratio", SOURCE,
                          f"{top[0]}: highest finished-request rate ({top[1]:.3g} req/s) / the fleet's mean"))
    q = _pick(reps, "waiting_mean", True)
    if q is not None:
        out.append(Signal("fleet_queue_busiest_mean", q[1], "requests", SOURCE, q[0]))
    kv = _pick(reps, "kv_max_ratio", True)
    if kv is not None:
        out.append(Signal("fleet_kv_usage_busiest_max_ratio", kv[1], "ratio", SOURCE, kv[0]))
    hi, lo = _pick(reps, "prefix_hit_ratio", True), _pick(reps, "prefix_hit_ratio", False)
    if hi is not None and lo is not None:
        out += [Signal("fleet_prefix_hit_max_ratio", hi[1], "ratio", SOURCE, hi[0]),
                Signal("fleet_prefix_hit_min_ratio", lo[1], "ratio", SOURCE, lo[0]),
                Signal("fleet_prefix_hit_spread_ratio", hi[1] - lo[1], "ratio", SOURCE,
                       f"{hi[0]} {hi[1]:.0%} vs {lo[0]} {lo[1]:.0%}: prefix-cache hit rate, highest - lowest")]
    restarts = reps.dropna(subset=["restarts"])
    if len(restarts):
        hit = restarts[restarts["restarts"] > 0]
        who = ", ".join(f"{a} ({b:.0f}x)" for a, b in zip(hit["name"], hit["restarts"], strict=True)) or "none"
        out.append(Signal("fleet_restarts_total", float(restarts["restarts"].sum()), "restarts", SOURCE, who))
    return out
