"""Stage-2 tables of distributions the report draws, computed once by the pipeline before the view: the CDF of
TTFT and of the chunk gaps (ITL) for each load phase, over the requests that count in that phase
(diagnose.requests.select, the one filter). The view draws the table; it computes no quantile."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from diagnose.model import Phase
from diagnose.requests import select

CDF_TABLE = "latency_cdf_by_phase"
CDF_COLUMNS = ["metric", "phase", "name", "n", "pct", "value_ms"]
CDF_PCTS = np.arange(101)  # 0, 1, ..., 100


def phase_cdfs(tables: Mapping[str, pd.DataFrame], phases: Sequence[Phase]) -> pd.DataFrame:
    """Rows (metric "ttft" or "itl", phase, phase name, n values, percentile 0..100, value ms): one CDF per
    phase with at least one value; empty for fewer than two phases (nothing to compare)."""
    req = tables.get("requests")
    empty = pd.DataFrame(columns=CDF_COLUMNS)
    if len(phases) < 2 or req is None or req.empty or "phase" not in req.columns or "ttft_ms" not in req.columns:
        return empty
    itl = tables.get("itl")
    has_itl = itl is not None and not itl.empty and {"itl_ms", "rid"} <= set(itl.columns)
    parts = []
    for ph in phases:
        ok = select(req, ph.window()).ok
        values = {"ttft": ok["ttft_ms"].to_numpy(dtype=float)}
        if has_itl:
            assert itl is not None
            values["itl"] = itl[itl["rid"].isin(ok["rid"])]["itl_ms"].to_numpy(dtype=float)
        for metric, vals in values.items():
            vals = vals[np.isfinite(vals)]
            if vals.size:
                parts.append(pd.DataFrame({"metric": metric, "phase": ph.phase, "name": ph.name, "n": int(vals.size),
                                           "pct": CDF_PCTS, "value_ms": np.percentile(vals, CDF_PCTS)}))
    return pd.concat(parts, ignore_index=True)[CDF_COLUMNS] if parts else empty
