"""Load-client sections: the client's self-check and, for a sweep, one row per load level."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from diagnose.analysis import Window
from diagnose.normalize.client import (
    CLIENT_CPU_BOUND_PERCENT,
    CLIENT_CPU_BOUND_SHARE,
    CLIENT_LAG_BOUND_MS,
    signals,
)

from .model import Cell, Phrase, Quantity, Section, Table

Tables = Mapping[str, pd.DataFrame]
SWEEP_KEYS = (("requests_measured", "requests"), ("ttft_p50_ms", "ms"), ("ttft_p99_ms", "ms"), ("itl_p50_ms", "ms"),
              ("itl_p99_ms", "ms"), ("output_tps", "tokens/s"), ("request_rps", "requests/s"),
              ("error_rate_ratio", "ratio"))


def _q(by: Mapping[str, float], key: str, unit: str) -> Quantity:
    v = by.get(key)
    return Quantity(None if v is None else float(v), unit, 2)


def sections(tables: Tables) -> list[Section]:
    req = tables.get("requests")
    if req is None or req.empty:
        return []
    t = dict(tables)
    out: list[Section] = []
    by = {s.name: s.value for s in signals(t, Window(-math.inf, math.inf))}
    rows: list[tuple[Cell, ...]] = [(label, _q(by, k, unit or "flag"), unit) for k, label, unit in (
        ("client_loop_lag_p99_ms", "event-loop lag P99", "ms"), ("client_schedule_lag_p99_ms", "send lag P99", "ms"),
        ("client_cpu_max_percent", "client CPU max", "% of one core"),
        ("client_bound_ratio", "client was the bottleneck (1 = yes)", ""))]
    if by.get("requests_excluded_profiler"):
        rows.append(("requests overlapping the profiler window, excluded from statistics",
                     int(by["requests_excluded_profiler"]), "requests"))
    itl = tables.get("itl")
    if itl is not None and not itl.empty:
        tok = pd.to_numeric(itl["tok"], errors="coerce").to_numpy(dtype=float)
        tok = tok[np.isfinite(tok)]
        if tok.size:
            rows.append(("content chunks carrying more than one token",
                         Quantity(float((tok > 1).mean()), "ratio", 4), "ratio"))
    errs = req[~req["ok"].astype(bool)]["error"].value_counts()
    for cat, n in errs.items():
        rows.append((f"requests failed: {cat}", int(n), "requests"))
    note = Phrase(("Client bottleneck when CPU >= ", Quantity(CLIENT_CPU_BOUND_PERCENT, "%", 0, "fixed"),
                   "% of a core in >= ", Quantity(CLIENT_CPU_BOUND_SHARE, "ratio", 0, "percent"),
                   " of samples, or loop/send lag P99 > ", Quantity(CLIENT_LAG_BOUND_MS, "ms", 0, "fixed"), " ms."))
    out.append(Section("client_self_check", "Load client self-check", Table(("check", "value", "unit"), tuple(rows),
                                                                             note), group="details", order=40))
    phases = tables.get("client_phases")
    if phases is not None and len(phases) > 1:
        prow: list[tuple[Cell, ...]] = []
        for p in phases.to_dict("records"):
            s = {x.name: x.value for x in signals(t, Window(p["start_s"], p["end_s"], int(p["phase"]), ""))}
            prow.append((str(p.get("name")), *(_q(s, k, unit) for k, unit in SWEEP_KEYS)))
        out.append(Section("client_sweep", "Load levels (sweep)", Table(
            ("level", "requests", "TTFT P50 ms", "TTFT P99 ms", "ITL P50 ms", "ITL P99 ms", "output tok/s", "req/s",
             "error rate"), tuple(prow), ""), group="latency", order=30))
    return out
