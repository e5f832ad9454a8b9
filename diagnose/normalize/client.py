"""Client-side tables and signals from the load probe's streams (requests, chunks, phases, client_health).

Every metric is defined once, here, and in docs/metrics.md (same names):
  TTFT        first_token_ns - sent_ns (first content chunk: non-empty text/content), ms
  E2E         end_ns - sent_ns (end: the response finished: ``[DONE]`` or the end of the body), ms
  ITL pooled  gaps between consecutive content chunks, all successful requests pooled, ms
  ITL req     per-request mean gap = (last chunk - first chunk) / (chunks - 1), ms
  TPOT        (E2E - TTFT) / (n - 1), n = output tokens (usage when reported, else counted from chunks), ms
  output tok/s per request = n / E2E; system output tok/s = sum n / span; request rate = successes / span,
              span = last end - first send of the window's measured requests
  error rate  failed / (ok + failed) (``incomplete`` = stopped by the capture, in neither)
  goodput     requests meeting every SLO term / span, and / all measured requests (failed ones never meet it)
Percentiles: numpy linear interpolation (P50/P90/P95/P99), max. Warm-up requests are never in statistics,
nor are requests overlapping the engine profiler's window (diagnose/capture/profiler_window.py: the profiler slows
the engine); with such a window the span is summed over the stretches of kept requests on either side of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from diagnose.analysis import Window
from diagnose.capture.profiler_window import overlaps, profiler_windows
from diagnose.io.bundle import Bundle
from diagnose.io.manifest import Workload
from diagnose.model import Signal
from diagnose.normalize import TableContext, client_stalls, errors
from diagnose.requests import PCTS, finite, in_flight_mean, percentiles, select, span_s
from diagnose.signals.catalog import SIGNALS

COLD_REQUESTS = 3  # ttft_cold_ratio: median TTFT of the first N requests vs the rest of their phase
# burst_tail_share_ratio: a request is sent in a burst when the client already has more than this many times
# its mean in flight (and at least one more than the mean); the tail is the requests at or above the TTFT P90
BURST_IN_FLIGHT_RATIO = 2.0
BURST_TAIL_MIN_REQUESTS = 20

REQUEST_COLUMNS = ["rid", "phase", "warmup", "ok", "error", "error_detail", "http_status", "api", "sent_s", "end_s",
                   "intended_s", "ttft_ms", "e2e_ms", "tpot_ms", "itl_mean_ms", "output_tokens", "output_tokens_usage",
                   "output_tokens_chunks", "n_chunks", "prompt_tokens", "prompt_tokens_planned",
                   "prompt_tokens_source", "output_tps_req", "schedule_lag_ms", "capped", "cached_tokens",
                   "finish_reason", "max_tokens", "trace_id", "span_id", "profiled", "retry_after_s",
                   "body_bytes", "session", "turn", "turns", "attempt"]
CUT_BELOW = 0.9  # an output ended for length under this share of its max_tokens was cut short by the server
EXCLUDED_COLUMNS = ["reason", "start_s", "end_s"]


def _f(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def tables(bundle: Bundle, ctx: TableContext | None = None) -> dict[str, pd.DataFrame]:
    if not bundle.has_stream("requests"):
        return {}
    ctx = ctx if ctx is not None else TableContext.defaults()
    anchor = bundle.anchor_mono_ns
    windows = profiler_windows(bundle.meta)
    chunks = {r["rid"]: r for r in bundle.iter_records("chunks") if "rid" in r and isinstance(r.get("t_ns"), list)}
    rows = []
    gap_rid: list[Any] = []
    gap_t: list[np.ndarray] = []
    gap_v: list[np.ndarray] = []
    gap_tok: list[np.ndarray] = []
    gap_phase: list[Any] = []
    seen: set[Any] = set()
    dups: list[Any] = []
    for r in bundle.iter_records("requests"):
        if r["rid"] in seen:  # a request recorded twice: counted once (the first record)
            dups.append(r["rid"])
            continue
        seen.add(r["rid"])
        sent = _f(r.get("sent_ns"))
        end = _f(r.get("end_ns"))
        first = _f(r.get("first_token_ns"))
        usage_n = r.get("output_tokens_usage")
        n = _f(usage_n) if isinstance(usage_n, int) else _f(r.get("output_tokens_chunks"))
        ttft = (first - sent) / 1e6
        e2e = (end - sent) / 1e6
        ch = chunks.get(r.get("rid"))
        itl_mean = math.nan
        if ch is not None and len(ch["t_ns"]) > 1:
            t = np.asarray(ch["t_ns"], dtype=np.int64)
            itl_mean = (t[-1] - t[0]) / 1e6 / (len(t) - 1)
            gaps = np.diff(t) / 1e6
            gap_rid.append(np.full(gaps.size, r["rid"], dtype=object))
            gap_phase.append(np.full(gaps.size, r.get("phase", 0)))
            gap_t.append((t[1:] - anchor) / 1e9)
            gap_v.append(gaps)
            tok = ch.get("tok")
            gap_tok.append(np.asarray(tok[1:], dtype=float) if isinstance(tok, list) and len(tok) == len(t)
                           else np.full(gaps.size, np.nan))
        intended = _f(r.get("intended_ns"))
        pu = r.get("prompt_tokens_usage")
        rows.append({
            "rid": r.get("rid"), "phase": r.get("phase", 0), "warmup": bool(r.get("warmup", False)),
            "ok": bool(r.get("ok", False)), "error": r.get("error"), "error_detail": r.get("error_detail"),
            "http_status": r.get("http_status"), "api": r.get("api"),
            "sent_s": (sent - anchor) / 1e9, "end_s": (end - anchor) / 1e9, "intended_s": (intended - anchor) / 1e9,
            "ttft_ms": ttft, "e2e_ms": e2e, "tpot_ms": (e2e - ttft) / (n - 1) if n > 1 else math.nan,
            "itl_mean_ms": itl_mean, "output_tokens": n, "output_tokens_usage": _f(usage_n),
            "output_tokens_chunks": _f(r.get("output_tokens_chunks")), "n_chunks": _f(r.get("n_chunks")),
            "prompt_tokens": _f(pu) if isinstance(pu, int) else _f(r.get("prompt_tokens")),
            "prompt_tokens_planned": _f(r.get("prompt_tokens")),
            "prompt_tokens_source": "usage" if isinstance(pu, int) else r.get("prompt_tokens_source"),
            "output_tps_req": n / (e2e / 1e3) if e2e > 0 else math.nan,
            "schedule_lag_ms": (sent - intended) / 1e6 if not r.get("capped") else math.nan,
            "capped": bool(r.get("capped", False)), "cached_tokens": _f(r.get("cached_tokens")),
            "finish_reason": r.get("finish_reason"), "max_tokens": _f(r.get("max_tokens")),
            "trace_id": r.get("trace_id"), "span_id": r.get("span_id"),
            "profiled": overlaps(sent, end, windows),
            # a task's request (attach --turns, probes/sessions.py; a replayed file's session): which task, turn
            "session": None if r.get("session") is None else str(r.get("session")), "turn": _f(r.get("turn")),
            "turns": _f(r.get("turns")), "attempt": _f(r.get("attempt")),
            "retry_after_s": _f(r.get("retry_after_s")),  # the server's Retry-After (429/503), when it sent one
            "body_bytes": _f(r.get("body_bytes")),  # the streamed answer's size (absent in older bundles)
        })
    if dups:
        shown = ", ".join(map(str, dups[:3])) + (", ..." if len(dups) > 3 else "")
        ctx.note(f"{bundle.stream_file('requests')}: skipped {len(dups)} duplicate request record(s) "
                    f"(request ids seen before: {shown}); each request counted once")
    out: dict[str, pd.DataFrame] = {"requests": pd.DataFrame(rows, columns=REQUEST_COLUMNS)}
    out["client_excluded"] = pd.DataFrame([{"reason": "profiler", "start_s": (a - anchor) / 1e9,
                                            "end_s": (b - anchor) / 1e9} for a, b in windows],
                                          columns=EXCLUDED_COLUMNS)
    if gap_v:
        out["itl"] = pd.DataFrame({"rid": np.concatenate(gap_rid), "phase": np.concatenate(gap_phase),
                                   "t_s": np.concatenate(gap_t), "itl_ms": np.concatenate(gap_v),
                                   "tok": np.concatenate(gap_tok)})
    else:
        out["itl"] = pd.DataFrame(columns=["rid", "phase", "t_s", "itl_ms", "tok"])
    health = [{"t_s": (_f(h.get("t_ns")) - anchor) / 1e9, "loop_lag_ms": _f(h.get("loop_lag_ms")),
               "in_flight": _f(h.get("in_flight")), "cpu_percent": _f(h.get("cpu_percent"))}
              for h in bundle.iter_records("client_health")]
    out["client_health"] = pd.DataFrame(health, columns=["t_s", "loop_lag_ms", "in_flight", "cpu_percent"])
    client_stalls.mark(out, bundle, ctx.thresholds)  # requests touched by one short client stall: left out, not the run
    # the self-check's stall rows (count, longest with its cause, requests left out), made once here for the report
    out["client_stall_checks"] = pd.DataFrame(client_stalls.report_rows(out), columns=["check", "value", "unit"],
                                              dtype=object)  # counts stay ints, the longest stall a float
    phases = []
    for p in bundle.iter_records("phases"):
        if "start_ns" in p:
            q = {k: v for k, v in p.items() if k not in ("start_ns", "end_ns")}
            q["start_s"] = (_f(p.get("start_ns")) - anchor) / 1e9
            q["end_s"] = (_f(p.get("end_ns")) - anchor) / 1e9
            phases.append(q)
    out["client_phases"] = pd.DataFrame(phases)
    wl = bundle.meta.workload or Workload()
    shared = wl.shared_prefix_fraction
    history = conversation_prefix_share(out["requests"])
    if history is not None and not (isinstance(shared, (int, float)) and shared >= history):
        shared = history  # multi-turn: each turn's prompt repeats the conversation before it (issue 34)
    facts = {"warmup_requests": wl.warmup_requests, "workload_shared_prefix_ratio": shared,
             "workload_logprobs_tokens": wl.logprobs}
    out["client_workload"] = pd.DataFrame([{"name": k, "value": float(v)} for k, v in facts.items()
                                           if isinstance(v, (int, float)) and not isinstance(v, bool)],
                                          columns=["name", "value"])
    out["client_slo"] = pd.DataFrame([{"key": k, "limit_ms": float(v)} for k, v in bundle.meta.options.slo.items()
                                      if v is not None and v > 0], columns=["key", "limit_ms"])
    return out


def conversation_prefix_share(req: pd.DataFrame) -> float | None:
    """Of multi-turn requests (attach --turns, a replayed session), the mean share of a prompt that repeats its
    conversation so far: for a turn after the first, (the previous turn's prompt + its answer) / this prompt,
    at most 1; a first turn repeats nothing (0). None where no session has two consecutive turns: the
    workload's shared prefix is then the client's --shared-prefix alone. A prefix cache can serve that share
    (SCH006 judges its hits against it)."""
    cols = ("session", "turn", "prompt_tokens", "output_tokens")
    if not len(req) or any(c not in req.columns for c in cols):
        return None
    r = req.loc[req["session"].notna() & np.isfinite(req["turn"].to_numpy(dtype=float)), list(cols)]
    if not len(r):
        return None
    shares: list[float] = []
    later = 0
    for _sess, g in r.groupby("session", sort=False):
        g = g.sort_values("turn", kind="stable")
        turn, prompt, answer = (g[c].to_numpy(dtype=float) for c in ("turn", "prompt_tokens", "output_tokens"))
        for i in range(len(g)):
            if i and turn[i] == turn[i - 1] + 1 and prompt[i] > 0 and np.isfinite(prompt[i - 1] + answer[i - 1]):
                shares.append(min(1.0, (prompt[i - 1] + answer[i - 1]) / prompt[i]))
                later += 1
            else:
                shares.append(0.0)
    return float(np.mean(shares)) if later else None


# -- signals -------------------------------------------------------------------------------------------
def _stream_bytes(ok: pd.DataFrame) -> list[Signal]:
    """``stream_bytes_per_token_mean``: the bytes of the streamed answers over their output tokens (requests that
    recorded both): what the server writes for each token (~200 bytes of JSON a chunk; several times that with
    log-probabilities asked, rule SCH014). Bundles recorded before the client counted bytes have none."""
    if "body_bytes" not in ok.columns or not len(ok):
        return []
    b, n = ok["body_bytes"].to_numpy(dtype=float), ok["output_tokens"].to_numpy(dtype=float)
    known = np.isfinite(b) & (b > 0) & np.isfinite(n) & (n > 0)
    if not known.any():
        return []
    return [_sig("stream_bytes_per_token_mean", float(b[known].sum() / n[known].sum()), "bytes")]


def _cut_outputs(ok: pd.DataFrame) -> list[Signal]:
    """``output_tokens_asked_mean`` and ``output_cut_share_ratio``: of the requests that asked for a length, the
    share the server ended for length (finish reason ``length``) with under ``CUT_BELOW`` of the tokens asked:
    cut by the context, not by the request's own max_tokens (chunk counts may miss a token or two, hence the
    margin)."""
    if "max_tokens" not in ok.columns or not len(ok):
        return []
    asked = ok["max_tokens"].to_numpy(dtype=float)
    got = ok["output_tokens"].to_numpy(dtype=float)
    known = np.isfinite(asked) & (asked > 0) & np.isfinite(got)
    if not known.any():
        return []
    cut = known & (ok["finish_reason"].to_numpy(dtype=object) == "length") & (got < CUT_BELOW * asked)
    return [_sig("output_tokens_asked_mean", float(asked[known].mean()), "tokens"),
            _sig("output_cut_share_ratio", float(cut.sum() / known.sum()), "ratio")]


def _sig(name: str, value: float, unit: str, series: Sequence[tuple[float, float]] = ()) -> Signal:
    return Signal(name=name, value=float(value), unit=unit, source="client", description=SIGNALS.get(name, ""),
                  series=tuple(series))


_finite = finite


def _pct_signals(prefix: str, values: Any, pcts: Sequence[tuple[str, float]] = PCTS) -> list[Signal]:
    return [_sig(f"{prefix}_{name}_ms", v, "ms") for name, v in percentiles(values, pcts).items()]


def good_mask(ok: pd.DataFrame, itl: pd.DataFrame, slo: pd.DataFrame) -> pd.Series:
    """Per request: meets every SLO term (ttft/tpot/e2e: its own value; itl: its own chunk-gap percentile)."""
    good = pd.Series(True, index=ok.index)
    for key, limit in zip(slo["key"], slo["limit_ms"], strict=True):
        metric, pct = key.split("_")[0], key.split("_")[1]
        if metric in ("ttft", "tpot", "e2e"):
            good &= ok[f"{metric}_ms"].fillna(math.inf) <= limit
        elif metric == "itl":
            q = 100.0 if pct == "max" else float(pct[1:])
            per = itl.groupby("rid")["itl_ms"].quantile(q / 100.0) if not itl.empty else pd.Series(dtype=float)
            good &= ok["rid"].map(per).fillna(0.0) <= limit
    return good


def _level(p: Mapping[str, object]) -> float | None:
    for key in ("concurrency", "rate"):
        v = p.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and math.isfinite(v):
            return float(v)
    return None


def _profiled(df: pd.DataFrame) -> pd.Series:
    """Per request: overlaps the engine profiler's window (so it is left out of the statistics)."""
    if "profiled" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["profiled"].fillna(False).astype(bool)


def _window_core(req: pd.DataFrame, itl: pd.DataFrame, window: Window,
                 slo: pd.DataFrame | None, excluded: pd.DataFrame | None = None) -> dict[str, Signal]:
    out: dict[str, Signal] = {}
    sel = select(req, window)
    if sel.total == 0:
        return out
    n_total, n_profiled, w, done, ok = sel.total, sel.profiled, sel.counted, sel.done, sel.ok
    n_stalled = sel.stalled
    rids = set(ok["rid"])
    gaps = itl[itl["rid"].isin(rids)] if not itl.empty else itl
    sigs: list[Signal] = []
    sigs += _pct_signals("ttft", ok["ttft_ms"])
    sigs += _pct_signals("itl", gaps["itl_ms"] if not gaps.empty else [])
    sigs += _pct_signals("tpot", ok["tpot_ms"], PCTS[:4])
    sigs += _pct_signals("e2e", ok["e2e_ms"])
    sigs += _pct_signals("itl_req_mean", ok["itl_mean_ms"], (("p50", 50), ("p99", 99)))
    span = span_s(w, excluded)
    sigs.append(_sig("requests_total", n_total, "requests"))
    sigs.append(_sig("requests_measured", len(ok), "requests"))
    if n_stalled:
        sigs.append(_sig("requests_excluded_client_stall", n_stalled, "requests"))
    if n_profiled:
        sigs.append(_sig("requests_excluded_profiler", n_profiled, "requests"))
        if excluded is not None and not excluded.empty:
            length = (excluded["end_s"] - excluded["start_s"]).to_numpy(dtype=float)
            length = length[np.isfinite(length)]
            if length.size:
                sigs.append(_sig("profiler_window_s", float(length.sum()), "s"))
    if len(done):
        sigs.append(_sig("error_rate_ratio", (~done["ok"].astype(bool)).sum() / len(done), "ratio"))
        sigs.append(_sig("http_429_ratio", (done["error"] == "http_429").sum() / len(done), "ratio"))
        sigs.extend(errors.signals(done, req))  # each failure named by its class (diagnose/normalize/errors.py)
    named = {x.name: x.value for x in sigs}
    if named.get("itl_p50_ms", 0) > 0 and "ttft_p50_ms" in named:
        sigs.append(_sig("ttft_p50_itl_ratio", named["ttft_p50_ms"] / named["itl_p50_ms"], "ratio"))
    flight = in_flight_mean(w, excluded)
    if flight is not None:
        sigs.append(_sig("client_in_flight_mean", flight, "requests"))
    if span > 0 and len(ok):
        sigs.append(_sig("output_tps", float(_finite(ok["output_tokens"]).sum()) / span, "tok/s"))
        sigs.append(_sig("request_rps", len(ok) / span, "req/s"))
    tps = _finite(ok["output_tps_req"])
    if tps.size:
        sigs.append(_sig("output_tps_per_req_p50", float(np.percentile(tps, 50)), "tok/s"))
    for col, name in (("prompt_tokens", "prompt_tokens_mean"), ("output_tokens", "output_tokens_mean")):
        vals = _finite(ok[col])
        if vals.size:
            sigs.append(_sig(name, float(vals.mean()), "tokens"))
    sigs.extend(_cut_outputs(ok))
    sigs.extend(_stream_bytes(ok))
    if slo is not None and not slo.empty and len(done):
        for key, limit in zip(slo["key"], slo["limit_ms"], strict=True):
            sigs.append(_sig(f"slo_{key}", float(limit), "ms"))
        n_good = int(good_mask(ok, gaps, slo).sum()) if len(ok) else 0
        sigs.append(_sig("goodput_ratio", n_good / len(done), "ratio"))
        if span > 0:
            sigs.append(_sig("goodput_rps", n_good / span, "req/s"))
    lag = _finite(w["schedule_lag_ms"])
    if lag.size:
        sigs.append(_sig("client_schedule_lag_p99_ms", float(np.percentile(lag, 99)), "ms"))
    for s in sigs:
        out[s.name] = s
    return out


def _self_check(health: pd.DataFrame | None, window: Window, out: dict[str, Signal]) -> None:
    if health is None or health.empty:
        return
    h = health[(health["t_s"] >= window.start_s) & (health["t_s"] <= window.end_s)]
    # the samples of a marked short stall stay in the series but not in the P99 (its requests are left out)
    lag, cpu = _finite(h["loop_lag_ms"][~client_stalls.touched(h)]), _finite(h["cpu_percent"])
    if lag.size:
        out["client_loop_lag_p99_ms"] = _sig("client_loop_lag_p99_ms", float(np.percentile(lag, 99)), "ms",
                                             list(zip(h["t_s"], h["loop_lag_ms"], strict=True))[:2000])
    if cpu.size:
        # every sample in the series (uncapped): rule VAL001 judges the share of samples at or above
        # $client_cpu_bound_percent (rules/thresholds.yaml), so the normaliser computes no verdict
        out["client_cpu_max_percent"] = _sig("client_cpu_max_percent", float(cpu.max()), "percent",
                                             list(zip(h["t_s"], h["cpu_percent"], strict=True)))


_FACT_UNITS = {"warmup_requests": "requests", "workload_logprobs_tokens": "tokens"}  # the others: ratios


def signals(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    req = tables.get("requests")
    if req is None or req.empty:
        return []
    itl = tables.get("itl", pd.DataFrame(columns=["rid", "phase", "t_s", "itl_ms", "tok"]))
    out = _window_core(req, itl, window, tables.get("client_slo"), tables.get("client_excluded"))
    wl = tables.get("client_workload")
    if wl is not None and out:  # workload facts the rules read (from the manifest's workload spec)
        for name, value in zip(wl["name"], wl["value"], strict=True):
            out[name] = _sig(name, float(value), _FACT_UNITS.get(name, "ratio"))
    _arrivals(req, tables.get("client_phases"), window, out)
    _self_check(tables.get("client_health"), window, out)
    if window.phase is None:
        _run_only(req, itl, tables.get("client_phases"), window, out, tables.get("client_excluded"))
    return list(out.values())


def _arrivals(req: pd.DataFrame, phases: pd.DataFrame | None, window: Window, out: dict[str, Signal]) -> None:
    """``workload_open_loop`` (1: every measured phase of the window sends at a rate or replays a workload
    file, 0: a closed loop at a concurrency) and, for an open loop, ``arrival_gap_cv_ratio``: the coefficient
    of variation of the gaps between the window's sends (Poisson 1; gamma arrivals of burstiness b about
    1/sqrt(b)); a request held back by ``--max-concurrency`` counts at its scheduled time. A closed loop sends
    when a request ends, so it has no arrival bursts of its own."""
    if phases is None or phases.empty or "phase" not in phases.columns:
        return
    rows = phases[phases["role"] != "baseline"] if "role" in phases.columns else phases
    if window.phase is not None:
        rows = phases[phases["phase"] == window.phase]
    modes = {str(m) for m in rows.get("mode", pd.Series(dtype=str)).dropna()}
    if not modes or not modes <= {"rate", "concurrency", "replay"}:
        return
    open_loop = modes <= {"rate", "replay"}  # a replay sends at the file's offsets, whatever completes
    out["workload_open_loop"] = _sig("workload_open_loop", 1.0 if open_loop else 0.0, "flag")
    if not open_loop:
        return
    sel = select(req, window).counted
    gaps: list[np.ndarray] = []
    for _ph, g in sel.groupby("phase"):
        # a send held back by --max-concurrency went when a slot freed, not when the workload had it arrive:
        # its arrival is its scheduled time, so the cap's releases do not read as bursty arrivals (issue 34)
        t = g["sent_s"].to_numpy(dtype=float)
        if "capped" in g.columns and "intended_s" in g.columns:
            held = g["capped"].fillna(False).astype(bool).to_numpy()
            t = np.where(held, g["intended_s"].to_numpy(dtype=float), t)
        t = np.sort(t)
        t = t[np.isfinite(t)]
        if t.size >= 3:
            gaps.append(np.diff(t))
    if gaps:
        d = np.concatenate(gaps)
        if d.size >= 10 and d.mean() > 0:
            out["arrival_gap_cv_ratio"] = _sig("arrival_gap_cv_ratio", float(d.std() / d.mean()), "ratio")
    share = _burst_tail_share(sel)
    if share is not None:
        out["burst_tail_share_ratio"] = _sig("burst_tail_share_ratio", share, "ratio")


def _burst_tail_share(sel: pd.DataFrame) -> float | None:
    """Of the TTFT tail's excess over the median (requests at or above the P90), the share that requests sent
    in a burst carry: sent while the client already had more than BURST_IN_FLIGHT_RATIO x its mean in flight.
    None with fewer than BURST_TAIL_MIN_REQUESTS finished requests or no excess."""
    if not {"sent_s", "end_s", "ttft_ms", "ok"} <= set(sel.columns):
        return None
    ok = sel[sel["ok"].astype(bool)]
    sent, end = ok["sent_s"].to_numpy(dtype=float), ok["end_s"].to_numpy(dtype=float)
    ttft = ok["ttft_ms"].to_numpy(dtype=float)
    keep = np.isfinite(sent) & np.isfinite(end) & np.isfinite(ttft)
    sent, end, ttft = sent[keep], end[keep], ttft[keep]
    if sent.size < BURST_TAIL_MIN_REQUESTS:
        return None
    span = float(end.max() - sent.min())
    if span <= 0:
        return None
    mean = float((end - sent).sum() / span)
    # in flight when each request was sent: sent before it (in send order, so sends at the same instant count
    # each other) and not yet ended; itself not counted
    rank = np.empty(sent.size, dtype=float)
    rank[np.argsort(sent, kind="stable")] = np.arange(sent.size)
    at = rank - np.searchsorted(np.sort(end), sent, side="right")
    burst = at > max(BURST_IN_FLIGHT_RATIO * mean, mean + 1.0)
    p50, p90 = np.percentile(ttft, 50), np.percentile(ttft, 90)
    tail, excess = ttft >= p90, np.clip(ttft - p50, 0.0, None)
    total = float(excess[tail].sum())
    return float(excess[tail & burst].sum()) / total if total > 0 else None


def _run_only(req: pd.DataFrame, itl: pd.DataFrame, phases: pd.DataFrame | None, window: Window,
              out: dict[str, Signal], excluded: pd.DataFrame | None = None) -> None:
    ok = req[req["ok"].astype(bool) & np.isfinite(req["ttft_ms"].to_numpy(dtype=float)) & ~_profiled(req)]
    ok = ok.sort_values("sent_s")
    if len(ok):
        # cold start: the first requests of the capture's first phase (warm-up included) vs the rest of that
        # phase, so load differences between phases do not pass for coldness
        first = ok[ok["phase"] == ok["phase"].iloc[0]]
        if len(first) >= 2 * COLD_REQUESTS:
            warm = float(np.median(first["ttft_ms"].iloc[COLD_REQUESTS:]))
            if warm > 0:
                cold = float(np.median(first["ttft_ms"].iloc[:COLD_REQUESTS]))
                out["ttft_cold_ratio"] = _sig("ttft_cold_ratio", cold / warm, "ratio")
                out["ttft_cold_p50_ms"] = _sig("ttft_cold_p50_ms", cold, "ms")
                out["ttft_warm_p50_ms"] = _sig("ttft_warm_p50_ms", warm, "ms")
    if phases is None or phases.empty:
        return
    levels = [p for p in phases.to_dict("records") if p.get("role", "measure") != "baseline"]
    levels = [p for p in levels if _level(p) is not None]
    if len(levels) < 2:
        return
    levels.sort(key=lambda p: _level(p) or 0.0)
    lo, hi = levels[0], levels[-1]
    s_lo = _window_core(req, itl, Window(lo["start_s"], lo["end_s"], int(lo["phase"]), ""), None, excluded)
    s_hi = _window_core(req, itl, Window(hi["start_s"], hi["end_s"], int(hi["phase"]), ""), None, excluded)
    out["sweep_levels"] = _sig("sweep_levels", len(levels), "levels")
    out["sweep_load_growth_ratio"] = _sig("sweep_load_growth_ratio", (_level(hi) or 0) / (_level(lo) or 1), "ratio")
    for key, name in (("ttft_p50_ms", "sweep_ttft_p50_growth_ratio"), ("itl_p50_ms", "sweep_itl_p50_growth_ratio"),
                      ("output_tps", "sweep_output_tps_growth_ratio")):
        a, b = s_lo.get(key), s_hi.get(key)
        if a is not None and b is not None and a.value > 0:
            out[name] = _sig(name, b.value / a.value, "ratio")
