"""llama.cpp's slots (stream ``slots`` from probes/slots.py) -> a table and signals.

Table ``slots``: ``t_s, slot, n_ctx, busy, used`` (one row per slot per sample; ``used`` = the tokens the
slot's context holds, prompt and generated so far, NaN when the slot did not say).

Signals (source ``server``):

* ``slot_context_tokens``: the context each slot has (``n_ctx`` of a slot: ``-c`` split between the ``-np``
  slots), the largest seen;
* ``slot_context_used_max_ratio``: the fullest a busy slot's context was in any sample (used / n_ctx): near 1 a
  slot's request ran out of context (llama.cpp then ends its output for length);
* ``slots_busy_mean``: busy slots per sample, mean.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from diagnose.analysis import Window
from diagnose.io.bundle import Bundle
from diagnose.model import Signal, Source
from diagnose.normalize import TableContext, sampled_in

SOURCE: Source = "server"
COLUMNS = ["t_s", "slot", "n_ctx", "busy", "used"]


def _n(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def tables(bundle: Bundle, ctx: TableContext | None = None) -> dict[str, pd.DataFrame]:
    if not bundle.has_stream("slots"):
        return {"slots": pd.DataFrame(columns=COLUMNS)}
    anchor = bundle.anchor_mono_ns
    rows = []
    for r in bundle.iter_records("slots"):
        t_s = (r["t_ns"] - anchor) / 1e9
        for i, s in enumerate(r.get("slots") or []):
            rows.append({"t_s": t_s, "slot": s.get("id", i), "n_ctx": _n(s.get("n_ctx")), "busy": bool(s.get("busy")),
                         "used": _n(s.get("tokens"))})
    return {"slots": pd.DataFrame(rows, columns=COLUMNS)}


def signals(t: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    df = t.get("slots")
    if df is None or df.empty:
        return []
    df = sampled_in(df, window)
    if df.empty:
        return []
    out: list[Signal] = []
    n_ctx = df["n_ctx"].to_numpy(dtype=float)
    if np.isfinite(n_ctx).any():
        out.append(Signal("slot_context_tokens", float(np.nanmax(n_ctx)), "tokens", SOURCE,
                          "the context of one llama.cpp slot (n_ctx from /slots: -c split between the slots)"))
    busy = df[df["busy"]]
    ratio = (busy["used"] / busy["n_ctx"]).to_numpy(dtype=float)
    ratio = ratio[np.isfinite(ratio)]
    samples = df.groupby("t_s")["busy"].sum()
    if ratio.size:
        out.append(Signal("slot_context_used_max_ratio", float(min(1.0, ratio.max())), "ratio", SOURCE,
                          f"the fullest a busy slot's context was: the tokens it held (prompt + generated) / n_ctx, max over "
                          f"{len(samples)} /slots samples"))
    out.append(Signal("slots_busy_mean", float(samples.mean()), "slots", SOURCE,
                      f"busy llama.cpp slots, mean of {len(samples)} /slots samples"))
    return out
