"""Sections of the OTel join (diagnose/normalize/otel.py): TTFT and E2E decomposition by percentile, the
share of TTFT per component, and the slowest requests' waterfalls."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from diagnose.capture.profiler_window import excluded_note
from diagnose.normalize.otel import joined

from .model import (
    BarSeries,
    Cell,
    Phrase,
    Quantity,
    Section,
    Segment,
    StackedBars,
    Table,
    TextBlock,
    Waterfall,
    WaterfallRow,
)

Tables = Mapping[str, pd.DataFrame]
PERCENTILES = (("P50", 50.0), ("P90", 90.0), ("P99", 99.0))
TTFT_PARTS = (("client+network", "client_network_ms"), ("server frontend", "frontend_ms"),
              ("queue", "queue_ms"), ("prefill", "prefill_ms"))
E2E_PARTS = (("client+network", "e2e_client_network_ms"), ("server frontend", "e2e_frontend_ms"),
             ("queue", "queue_ms"), ("prefill", "prefill_ms"), ("decode", "decode_ms"))
SLOWEST = 10


def _pos(v: Any) -> float:
    f = float(v)
    return max(f, 0.0) if math.isfinite(f) else 0.0


def _ms0(v: Any) -> Quantity:
    return Quantity(float(v), "ms", 0, "fixed")


def at_percentile(df: pd.DataFrame, col: str, pct: float) -> pd.Series:
    """The request whose ``col`` sits at the percentile (nearest rank), so its parts add up to it."""
    ordered = df.sort_values(col)
    idx = min(len(ordered) - 1, max(0, math.ceil(pct / 100.0 * len(ordered)) - 1))
    return ordered.iloc[idx]


def _bars(df: pd.DataFrame, total_col: str, parts: tuple[tuple[str, str], ...]) -> StackedBars:
    reps = [at_percentile(df, total_col, p) for _, p in PERCENTILES]
    cats = tuple(Phrase((f"{label} (", _ms0(r[total_col]), " ms)")) for (label, _), r in zip(PERCENTILES, reps,
                                                                                              strict=True))
    series = tuple(BarSeries(name, tuple(round(_pos(r[col]), 3) for r in reps)) for name, col in parts)
    return StackedBars(cats, series, "ms", x_label="time", y_label="request at")


def _share_table(df: pd.DataFrame, total_col: str, parts: tuple[tuple[str, str], ...], client: bool,
                 excluded_profiled: int = 0) -> Table:
    total = float(np.nansum(df[total_col].to_numpy(dtype=float)))
    rows: list[tuple[Cell, ...]] = []
    for name, col in parts:
        arr = df[col].to_numpy(dtype=float)
        arr = arr[np.isfinite(arr)]
        if not arr.size:
            continue
        share = float(np.sum(np.clip(arr, 0, None))) / total if total > 0 else math.nan
        rows.append((name, Quantity(float(np.mean(arr)), "ms"), Quantity(float(np.percentile(arr, 50)), "ms"),
                     Quantity(float(np.percentile(arr, 99)), "ms"), Quantity(share, "ratio")))
    what = "client TTFT" if client else "server TTFT (no client timings were joined)"
    note: list[str | Quantity] = [
        Quantity(len(df), "requests"),
        f" requests. Share = sum of the part / sum of {what}. server frontend = server TTFT - queue - prefill "
        "(tokenisation, scheduling hand-off, detokenisation of the first token); client+network = client TTFT - "
        "server TTFT (sending, connection, streaming the first chunk back)."]
    if excluded_profiled:
        note.append(f" {excluded_note(excluded_profiled)}.")
    return Table(("part", "mean ms", "P50 ms", "P99 ms", "share of TTFT"), tuple(rows), Phrase(tuple(note)))


def _waterfall(df: pd.DataFrame) -> Waterfall:
    col = "client_e2e_ms" if df["client_e2e_ms"].notna().any() else "server_e2e_ms"
    slow = df[np.isfinite(df[col].to_numpy(dtype=float))].sort_values(col, ascending=False).head(SLOWEST)
    rows = []
    for _, r in slow.iterrows():
        client = math.isfinite(float(r["client_ttft_ms"]))
        end = float(r["client_e2e_ms"]) if client else float(r["server_e2e_ms"])
        ttft = float(r["client_ttft_ms"]) if client else float(r["server_ttft_ms"])
        label = str(r["rid"]) if isinstance(r["rid"], str) else str(r["trace_id"])[:12]
        rows.append(WaterfallRow(Phrase((f"{label} (TTFT ", _ms0(ttft), " ms, E2E ", _ms0(end), " ms)")),
                                 _segments(r, client, end)))
    return Waterfall(tuple(rows), "ms")


def _segments(r: pd.Series, client: bool, end: float) -> tuple[Segment, ...]:
    """One request on a time line from the client's send (0 ms): client+network until the server's arrival
    stamp, then frontend, queue and prefill (together the server TTFT), decode, and the rest until the
    response ended at the client (server-side output processing and the trip back). The frontend is drawn
    as one block before the queue although part of it (detokenising the first token) comes after prefill."""
    parts: list[tuple[str, float]] = []
    if client:
        parts.append(("client+network", float(r["pre_server_ms"])))
    parts += [("server frontend", float(r["frontend_ms"])), ("queue", float(r["queue_ms"])),
              ("prefill", float(r["prefill_ms"])), ("decode", float(r["decode_ms"]))]
    segs: list[Segment] = []
    t = 0.0
    for name, dur in parts:
        d = _pos(dur)
        if d > 0:
            segs.append(Segment(name, round(t, 3), round(t + d, 3)))
        t += d
    if end - t > 0:
        segs.append(Segment("rest (output, streaming back)", round(t, 3), round(end, 3)))
    return tuple(segs)


def report_sections(rb: pd.DataFrame, joined_rows: pd.DataFrame, excluded_profiled: int = 0) -> list[Section]:
    """Sections from the non-warm-up breakdown ``rb`` and its client-joined rows ``joined_rows``
    (``excluded_profiled``: requests left out of both for overlapping the profiler window, for the note)."""
    client = len(joined_rows) > 0
    df = joined_rows if client else rb[np.isfinite(rb["server_ttft_ms"].to_numpy(dtype=float))]
    if df.empty:
        return []
    ttft_col = "client_ttft_ms" if client else "server_ttft_ms"
    e2e_col = "client_e2e_ms" if client else "server_e2e_ms"
    ttft_parts = TTFT_PARTS if client else TTFT_PARTS[1:]
    e2e_parts = E2E_PARTS if client else E2E_PARTS[1:]
    out = [
        Section("otel_ttft_decomposition", "TTFT decomposition by percentile (joined server spans)",
                _bars(df, ttft_col, ttft_parts), group="latency", order=40),
        Section("otel_ttft_shares", "Where TTFT goes: queue vs prefill vs frontend",
                _share_table(df, ttft_col, ttft_parts, client, excluded_profiled), group="latency", order=41),
    ]
    e2e = df[np.isfinite(df[e2e_col].to_numpy(dtype=float))]
    if len(e2e):
        out.append(Section("otel_e2e_decomposition", "E2E decomposition by percentile (joined server spans)",
                           _bars(e2e, e2e_col, e2e_parts), group="latency", order=42))
        out.append(Section("otel_slowest_waterfall", f"Slowest {min(SLOWEST, len(e2e))} requests", _waterfall(e2e),
                           group="latency", order=43))
    if client:
        unmatched = rb[rb["rid"].notna() & rb["ok"].astype(bool) & ~rb["matched"]]
        if len(unmatched):
            out.append(Section("otel_unmatched", "Requests without a server span", TextBlock(Phrase((
                Quantity(len(unmatched), "requests"),
                " successful request(s) had no server span with their trace id: the engine may sample spans, drop "
                "them under load, or have exported them after the capture ended."))), group="latency", order=44))
    return out


def sections(tables: Tables) -> list[Section]:
    rb = tables.get("request_breakdown")
    if rb is None or rb.empty:
        return []
    keep = ~rb["warmup"].astype(bool)
    n_profiled = 0
    if "profiled" in rb.columns:
        n_profiled = int((keep & rb["profiled"].astype(bool)).sum())
        keep &= ~rb["profiled"].astype(bool)
    return report_sections(rb[keep], joined(rb[keep]), excluded_profiled=n_profiled)
