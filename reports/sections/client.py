"""Load-client sections: the client's self-check and, for a sweep, one row per load level."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from diagnose.analysis import Window
from diagnose.model import Signal
from diagnose.normalize.client import signals

from .model import Cell, Quantity, Section, Table

Tables = Mapping[str, pd.DataFrame]


def _q(by: Mapping[str, float], key: str, unit: str) -> Quantity:
    v = by.get(key)
    return Quantity(None if v is None else float(v), unit, 2)


def sections(tables: Tables, run_signals: Mapping[str, Signal] | None = None) -> list[Section]:
    """The client's self-check over the run window: from the analysis's signals when given (the view passes
    them), else computed from the tables (a lone table set). A sweep's per-level figures are the view's
    "By load level" table, not repeated here."""
    req = tables.get("requests")
    if req is None or req.empty:
        return []
    out: list[Section] = []
    sigs = run_signals.values() if run_signals is not None else signals(dict(tables), Window(-math.inf, math.inf))
    by = {s.name: s.value for s in sigs}
    rows: list[tuple[Cell, ...]] = [(label, _q(by, k, unit or "flag"), unit) for k, label, unit in (
        ("client_loop_lag_p99_ms", "event-loop lag P99", "ms"), ("client_schedule_lag_p99_ms", "send lag P99", "ms"),
        ("client_cpu_max_percent", "client CPU max", "% of one core"))]
    if by.get("requests_excluded_profiler"):
        rows.append(("requests overlapping the profiler window, excluded from statistics",
                     int(by["requests_excluded_profiler"]), "requests"))
    stall_checks = tables.get("client_stall_checks")  # the client normaliser's rows (normalize/client_stalls.py)
    for check, value, unit in [] if stall_checks is None else stall_checks.itertuples(index=False):
        rows.append((str(check), Quantity(float(value), str(unit), 1) if isinstance(value, float) else int(value),
                     str(unit)))
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
    note = ("Rule VAL001 judges the client a bottleneck from these figures (thresholds client_cpu_bound_percent, "
            "client_cpu_bound_share, client_loop_lag_max_ms, client_schedule_lag_max_ms: "
            "`diagnose rules thresholds`).")
    out.append(Section("client_self_check", "Load client self-check", Table(("check", "value", "unit"), tuple(rows),
                                                                             note), group="details", order=40))
    return out
