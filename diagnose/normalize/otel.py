"""Engine request spans joined to client requests by trace id: where each request's time went.

Definitions (docs/otel-join.md has them in full; vLLM's ``llm_request`` span attributes, in seconds):
  server TTFT  gen_ai.latency.time_to_first_token (from the frontend's arrival time)
  queue        gen_ai.latency.time_in_queue
  prefill      gen_ai.latency.time_in_model_prefill
  decode       gen_ai.latency.time_in_model_decode
  server E2E   gen_ai.latency.e2e
Per joined request (client TTFT/E2E from the load probe's requests, ms):
  client+network = client TTFT - server TTFT        frontend = server TTFT - queue - prefill
  E2E:  client+network = client E2E - server E2E    frontend = server E2E - queue - prefill - decode
Shares of TTFT are ratios of sums over the window's joined, successful, non-warm-up requests (so
they add up to 1). Requests overlapping the engine profiler's window (column ``profiled``,
diagnose/capture/profiler_window.py) are left out of the signals and sections, like the client statistics.
Without client timings (observe mode, a span file) the shares are of server TTFT and there is no
client+network share.
"""

from __future__ import annotations

import gzip
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from diagnose.analysis import Window
from diagnose.capture.profiler_window import overlaps, profiler_windows
from diagnose.errors import InputError
from diagnose.io.bundle import Bundle
from diagnose.model import Signal
from diagnose.normalize import TableContext
from diagnose.requests import window_mask
from diagnose.signals.catalog import SIGNALS

MAX_SPAN_FILE_BYTES = 1 << 30  # 1 GiB (decompressed): a post-mortem span file, read whole into memory

LAT = "gen_ai.latency."
REQUEST_SPAN_NAMES = ("llm_request",)
SPAN_COLUMNS = ["trace_id", "span_id", "parent_span_id", "name", "kind", "start_s", "end_s", "duration_ms",
                "source", "service_name", "server_ttft_ms", "server_e2e_ms", "queue_ms", "prefill_ms", "decode_ms",
                "inference_ms", "prompt_tokens", "completion_tokens", "request_id"]
BREAKDOWN_COLUMNS = ["rid", "phase", "warmup", "ok", "trace_id", "matched", "t_s", "server_start_s",
                     "client_ttft_ms", "client_e2e_ms", "server_ttft_ms", "server_e2e_ms", "queue_ms", "prefill_ms",
                     "decode_ms", "frontend_ms", "client_network_ms", "e2e_frontend_ms", "e2e_client_network_ms",
                     "pre_server_ms", "prompt_tokens", "completion_tokens", "profiled"]
_LAT_COLS = {"server_ttft_ms": "time_to_first_token", "server_e2e_ms": "e2e", "queue_ms": "time_in_queue",
             "prefill_ms": "time_in_model_prefill", "decode_ms": "time_in_model_decode",
             "inference_ms": "time_in_model_inference"}


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


# -- tables ----------------------------------------------------------------------------------------
def tables(bundle: Bundle, ctx: TableContext | None = None) -> dict[str, pd.DataFrame]:
    spans = list(bundle.iter_records("spans"))
    if not spans:
        return {}
    requests = list(bundle.iter_records("requests")) if bundle.has_stream("requests") else []
    return build_tables(spans, requests, anchor_unix_ns=bundle.anchor_unix_ns, anchor_mono_ns=bundle.anchor_mono_ns,
                        windows=profiler_windows(bundle.meta))


def spans_table(spans: Iterable[dict[str, Any]], anchor_unix_ns: int) -> pd.DataFrame:
    rows = []
    for s in spans:
        a = s.get("attributes") or {}
        start, end = _num(s.get("start_unix_ns")), _num(s.get("end_unix_ns"))
        row: dict[str, Any] = {
            "trace_id": s.get("trace_id"), "span_id": s.get("span_id"), "parent_span_id": s.get("parent_span_id"),
            "name": s.get("name"), "kind": s.get("kind"), "start_s": (start - anchor_unix_ns) / 1e9,
            "end_s": (end - anchor_unix_ns) / 1e9, "duration_ms": (end - start) / 1e6, "source": s.get("source"),
            "service_name": (s.get("resource") or {}).get("service.name"),
            "prompt_tokens": _num(a.get("gen_ai.usage.prompt_tokens")),
            "completion_tokens": _num(a.get("gen_ai.usage.completion_tokens")),
            "request_id": a.get("gen_ai.request.id"),
        }
        for col, key in _LAT_COLS.items():
            row[col] = _num(a.get(LAT + key)) * 1e3
        rows.append(row)
    return pd.DataFrame(rows, columns=SPAN_COLUMNS)


def _request_spans(spans: pd.DataFrame) -> pd.DataFrame:
    """One server request span per trace: ``llm_request`` (or any span carrying gen_ai TTFT), earliest first."""
    is_req = spans["name"].isin(REQUEST_SPAN_NAMES) | np.isfinite(spans["server_ttft_ms"].to_numpy(dtype=float))
    req = spans[is_req & spans["kind"].ne("CLIENT")].sort_values("start_s")
    return req.drop_duplicates("trace_id", keep="first")


def build_tables(spans: Sequence[dict[str, Any]], requests: Sequence[dict[str, Any]], *, anchor_unix_ns: int,
                 anchor_mono_ns: int, windows: Sequence[tuple[float, float]] = ()) -> dict[str, pd.DataFrame]:
    """``windows``: the profiler's excluded spans in CLOCK_MONOTONIC ns (diagnose/capture/profiler_window.py)."""
    rel = [((a - anchor_mono_ns) / 1e9, (b - anchor_mono_ns) / 1e9) for a, b in windows]
    st = spans_table(spans, anchor_unix_ns)
    server = _request_spans(st).set_index("trace_id", drop=False)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for r in requests:
        tid = r.get("trace_id")
        sent, first, end = _num(r.get("sent_ns")), _num(r.get("first_token_ns")), _num(r.get("end_ns"))
        row: dict[str, Any] = {c: math.nan for c in BREAKDOWN_COLUMNS}
        row.update({"rid": r.get("rid"), "phase": r.get("phase", 0), "warmup": bool(r.get("warmup")),
                    "ok": bool(r.get("ok")), "trace_id": tid, "matched": False,
                    "t_s": (sent - anchor_mono_ns) / 1e9, "client_ttft_ms": (first - sent) / 1e6,
                    "client_e2e_ms": (end - sent) / 1e6, "profiled": overlaps(sent, end, windows)})
        if isinstance(tid, str) and tid in server.index:
            seen.add(tid)
            _fill_server(row, server.loc[tid])
            row["matched"] = True
            # both clocks are the host's: server arrival (wall) vs client send (monotonic) through the anchor
            row["pre_server_ms"] = (row["server_start_s"] - row["t_s"]) * 1e3
        rows.append(row)
    for tid, sp in server.iterrows():
        if tid in seen:
            continue
        row = dict.fromkeys(BREAKDOWN_COLUMNS, math.nan)
        row.update({"rid": None, "phase": None, "warmup": False, "ok": True, "trace_id": tid, "matched": False})
        _fill_server(row, sp)
        row["t_s"] = row["server_start_s"]
        row["profiled"] = overlaps(row["t_s"], row["t_s"] + _num(row["server_e2e_ms"]) / 1e3, rel)
        rows.append(row)
    rb = pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)
    rb["frontend_ms"] = rb["server_ttft_ms"] - rb["queue_ms"] - rb["prefill_ms"]
    rb["e2e_frontend_ms"] = rb["server_e2e_ms"] - rb["queue_ms"] - rb["prefill_ms"] - rb["decode_ms"]
    rb["client_network_ms"] = rb["client_ttft_ms"] - rb["server_ttft_ms"]
    rb["e2e_client_network_ms"] = rb["client_e2e_ms"] - rb["server_e2e_ms"]
    rb["matched"] = rb["matched"].astype(bool)
    rb["profiled"] = rb["profiled"].fillna(False).astype(bool)
    return {"spans": st, "request_breakdown": rb}


def _fill_server(row: dict[str, Any], sp: pd.Series) -> None:
    for c in ("server_ttft_ms", "server_e2e_ms", "queue_ms", "prefill_ms", "decode_ms", "prompt_tokens",
              "completion_tokens"):
        row[c] = sp[c]
    row["server_start_s"] = sp["start_s"]


# -- post-mortem span files ---------------------------------------------------------------------------
def read_spans_file(path: str | Path) -> list[dict[str, Any]]:
    """Normalised spans from an OTLP JSON file: one export object, a list of them, JSON lines of them (the
    OpenTelemetry Collector file exporter), or diagnose's own spans.jsonl; optionally gzipped."""
    from diagnose.io.bundle import read_input
    from diagnose.io.otlp import OtlpDecodeError, decode_request, parse_json_obj

    p = Path(path)
    too_big = (f"a span file over {MAX_SPAN_FILE_BYTES >> 20} MiB (decompressed); give a capture bundle or split "
               "the file")
    try:
        raw = read_input(p, MAX_SPAN_FILE_BYTES, too_big)
        if raw[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
                raw = gz.read(MAX_SPAN_FILE_BYTES + 1)
            if len(raw) > MAX_SPAN_FILE_BYTES:
                raise InputError(f"{p}: {too_big}")
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise InputError(f"{p}: cannot read span file ({getattr(e, 'strerror', None) or e})") from None
    try:
        docs: list[Any] = [orjson.loads(raw)]
    except orjson.JSONDecodeError:
        docs = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                docs.append(orjson.loads(line))
            except orjson.JSONDecodeError as e:
                raise InputError(f"{p}:{n}: not JSON ({e})") from None
    if len(docs) == 1 and isinstance(docs[0], list):
        docs = docs[0]
    spans: list[dict[str, Any]] = []
    for n, doc in enumerate(docs, 1):
        if isinstance(doc, dict) and "trace_id" in doc and "start_unix_ns" in doc:
            spans.append(doc)
            continue
        try:
            got, _invalid, _dropped = decode_request(parse_json_obj(doc), source="file")
        except OtlpDecodeError as e:
            raise InputError(f"{p}: record {n}: {e}") from None
        spans.extend(got)
    if not spans:
        raise InputError(f"{p}: no spans found (expected OTLP JSON with resourceSpans)")
    return spans


def load_spans_file(path: str | Path) -> dict[str, pd.DataFrame]:
    """Tables of a span file (t_s measured from its earliest span), for ``diagnose analyze spans.json``."""
    spans = read_spans_file(path)
    anchor = min(int(s.get("start_unix_ns") or 0) for s in spans)
    return build_tables(spans, [], anchor_unix_ns=anchor, anchor_mono_ns=0)


# -- signals -------------------------------------------------------------------------------------------
def _sig(name: str, value: float, unit: str, description: str = "",
         series: Sequence[tuple[float, float]] = ()) -> Signal:
    return Signal(name=name, value=float(value), unit=unit, source="server",
                  description=description or SIGNALS.get(name, ""), series=tuple(series))


def in_window(rb: pd.DataFrame, window: Window) -> pd.DataFrame:
    """The rows of the breakdown table in ``window``'s statistics (diagnose.requests.window_mask, by server
    start time; server spans no client request matched are kept by time in a phase window)."""
    return rb[window_mask(rb, window, time_col="t_s", keep_unphased=True)]


def joined(rb: pd.DataFrame) -> pd.DataFrame:
    """Successful requests with both client and server TTFT (the rows the decomposition uses)."""
    m = rb[rb["matched"] & rb["ok"].astype(bool)]
    ok = np.isfinite(m["client_ttft_ms"].to_numpy(dtype=float)) & np.isfinite(m["server_ttft_ms"].to_numpy(dtype=float))
    return m[ok]


def _share_series(df: pd.DataFrame, part: str, total: str, bin_s: float = 1.0) -> list[tuple[float, float]]:
    if df.empty:
        return []
    t = df["t_s"].to_numpy(dtype=float)
    bins = np.floor((t - t.min()) / bin_s)
    out = []
    for b in np.unique(bins):
        sel = bins == b
        tot = float(np.nansum(df[total].to_numpy(dtype=float)[sel]))
        if tot > 0:
            part_v = np.clip(df[part].to_numpy(dtype=float)[sel], 0, None)
            out.append((float(t.min() + b * bin_s), float(np.nansum(part_v)) / tot))
    return out


TAIL_MIN_REQUESTS = 5  # the slow requests' split needs at least this many of them


def _part_shares(j: pd.DataFrame, parts: tuple[tuple[str, str], ...], total: float) -> dict[str, float]:
    """Each part column's sum (negatives clipped) over ``total``: the TTFT split of the requests in ``j``."""
    return {col: float(np.nansum(np.clip(j[col].to_numpy(dtype=float), 0, None))) / total for col, _ in parts}


def tail_pct(tables: dict[str, pd.DataFrame]) -> float:
    """The percentile the TTFT SLO is set at (ttft_p99 -> 99), else 90: the slow requests are those at or above it."""
    slo = tables.get("client_slo")
    if slo is not None and not slo.empty and "key" in slo.columns:
        for key in slo["key"].astype(str):
            if key.startswith("ttft_p") and key[6:].replace(".", "", 1).isdigit():
                return float(key[6:])
    return 90.0


def _tail_split(j: pd.DataFrame, total_col: str, parts: tuple[tuple[str, str], ...], pct: float,
                note: str) -> list[Signal]:
    """The TTFT split of the slow requests only: those at or above the ``pct`` percentile of TTFT (what an SLO
    at that percentile judges), so a cause that hurts only the tail is not averaged away."""
    tt = j[total_col].to_numpy(dtype=float)
    if not np.isfinite(tt).any():
        return []
    tail = j[tt >= np.nanpercentile(tt, pct)]
    total = float(np.nansum(tail[total_col].to_numpy(dtype=float)))
    if len(tail) < TAIL_MIN_REQUESTS or total <= 0:
        return []
    shares = _part_shares(tail, parts, total)
    out = []
    for col, name in parts:
        tname = name.replace("ttft_", "ttft_tail_", 1)
        out.append(_sig(tname, shares[col], "ratio", f"{SIGNALS.get(tname, '')}: the {len(tail)} requests at or "
                                                     f"above the TTFT P{pct:g}{note}"))
    return out


def signals(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    rb = tables.get("request_breakdown")
    if rb is None or rb.empty:
        return []
    w = in_window(rb, window)
    out: list[Signal] = []
    client = w[w["rid"].notna()]
    eligible = client[client["ok"].astype(bool) & client["trace_id"].notna()]
    if len(eligible):
        out.append(_sig("join_matched_ratio", float(eligible["matched"].mean()), "ratio"))
    j = joined(w)
    parts: tuple[tuple[str, str], ...]
    if len(j):
        total_col, parts = "client_ttft_ms", (("queue_ms", "ttft_queue_share_ratio"),
                                              ("prefill_ms", "ttft_prefill_share_ratio"),
                                              ("frontend_ms", "ttft_frontend_share_ratio"),
                                              ("client_network_ms", "ttft_client_network_share_ratio"))
        note = ""
    else:  # no client timings: shares of the server's own TTFT
        j = w[np.isfinite(w["server_ttft_ms"].to_numpy(dtype=float))]
        total_col, parts = "server_ttft_ms", (("queue_ms", "ttft_queue_share_ratio"),
                                              ("prefill_ms", "ttft_prefill_share_ratio"),
                                              ("frontend_ms", "ttft_frontend_share_ratio"))
        note = " (of server TTFT: no client timings joined)"
    total = float(np.nansum(j[total_col].to_numpy(dtype=float))) if len(j) else 0.0
    if total > 0:
        shares = _part_shares(j, parts, total)
        for col, name in parts:
            out.append(_sig(name, shares[col], "ratio", SIGNALS.get(name, "") + note, _share_series(j, col, total_col)))
        out.append(_sig("ttft_engine_share_ratio", shares["queue_ms"] + shares["prefill_ms"], "ratio",
                        SIGNALS["ttft_engine_share_ratio"] + note))
        out.extend(_tail_split(j, total_col, parts, tail_pct(tables), note))
        if total_col == "client_ttft_ms":  # per request: client TTFT - the engine's own TTFT (issue 34)
            gap = j["client_network_ms"].to_numpy(dtype=float)
            gap = gap[np.isfinite(gap)]
            if gap.size:
                out.append(_sig("ttft_client_network_p50_ms", float(np.percentile(gap, 50)), "ms",
                                SIGNALS["ttft_client_network_p50_ms"]))
    server = w[np.isfinite(w["server_ttft_ms"].to_numpy(dtype=float))]
    if len(server):
        out.append(_sig("span_requests_count", float(len(server)), "count", "server request spans in the window"))
        for col, stem, what in (("queue_ms", "span_queue_time", "queue time"),
                                ("prefill_ms", "span_prefill_time", "prefill time"),
                                ("decode_ms", "span_decode_time", "decode time"),
                                ("frontend_ms", "span_frontend_time", "frontend time (TTFT - queue - prefill)"),
                                ("server_ttft_ms", "span_ttft", "server TTFT")):
            arr = server[col].to_numpy(dtype=float)
            arr = arr[np.isfinite(arr)]
            if arr.size:
                p50, p99 = np.percentile(arr, [50, 99])
                out.append(_sig(f"{stem}_p50_ms", float(p50), "ms", f"server span {what} P50 (ms)"))
                out.append(_sig(f"{stem}_p99_ms", float(p99), "ms", f"server span {what} P99 (ms)"))
    return out
