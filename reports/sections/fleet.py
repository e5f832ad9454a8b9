"""Fleet sections (docs/fleet.md): one row per replica, named by its labels, and each replica's load over time."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from diagnose.normalize.fleet import load_points

from .model import Cell, LineChart, LineSeries, Quantity, Section, Table

Tables = Mapping[str, pd.DataFrame]

# (column of the fleet_replicas table, header, unit, digits, scale)
COLUMNS: tuple[tuple[str, str, str, int, float], ...] = (
    ("load_mean", "in flight (mean)", "requests", 2, 1.0), ("running_mean", "running (mean)", "requests", 2, 1.0),
    ("waiting_mean", "waiting (mean)", "requests", 2, 1.0), ("waiting_max", "waiting (max)", "requests", 0, 1.0),
    ("kv_max_ratio", "KV cache (max %)", "%", 1, 100.0), ("request_rps", "requests/s", "req/s", 3, 1.0),
    ("output_tps", "output tokens/s", "tokens/s", 1, 1.0), ("prefix_hit_ratio", "prefix-cache hits %", "%", 1, 100.0),
    ("ttft_p99_ms", "TTFT P99 ms", "ms", 1, 1.0), ("queue_time_mean_ms", "queue time mean ms", "ms", 1, 1.0),
    ("preemptions", "preemptions", "", 0, 1.0), ("restarts", "restarts", "", 0, 1.0),
)


def _cell(v: object, unit: str, digits: int, scale: float) -> Cell:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(float(v)):
        return ""
    return Quantity(float(v) * scale, unit, digits, "fixed")


def sections(tables: Tables) -> list[Section]:
    reps = tables.get("fleet_replicas")
    if reps is None or reps.empty:
        return []
    present = [c for c in COLUMNS if reps[c[0]].notna().any()]
    rows: list[tuple[Cell, ...]] = []
    for _i, r in reps.sort_values(["load_mean", "name"], ascending=[False, True], na_position="last").iterrows():
        rows.append((str(r["name"]), str(r["labels"]), *(_cell(r[c], u, d, s) for c, _h, u, d, s in present),
                     str(r["why"]) if r["detail"] else "no"))
    out = [Section("fleet_replicas", f"Replicas ({len(reps)})", Table(
        ("replica", "labels", *(h for _c, h, _u, _d, _s in present), "pulled at full resolution"), tuple(rows),
        "Means over the window of the series Prometheus aggregated per replica (sum by replica labels, rate() of "
        "the counters); totals from increase() and histogram_quantile() over the whole window (docs/fleet.md)."),
        group="server", order=5)]
    series = tables.get("fleet_series")
    if series is not None and not series.empty:
        lines = [LineSeries(str(name), tuple((round(t, 3), v) for t, v in pts))
                 for name in sorted(series["name"].unique()) if (pts := load_points(series, str(name)))]
        if lines:
            out.append(Section("fleet_load", "Requests in flight per replica", LineChart(
                tuple(lines), x_label="time (s)", y_label="requests"), group="server", order=6))
    return out
