"""The workload card: what load a bundle carries, stated as data (issue 16; docs/workload.md).

From the manifest's workload spec (what was asked: mode, arrival process, levels, the replayed file) and the
requests the client recorded (what was measured: rate, requests in flight, input/output length percentiles,
cached-token share), or, for an observe-mode bundle, the server's own counters. ``analyze --json`` writes it
under ``workload_card``; the HTML report shows it at the top.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from diagnose.io.manifest import Manifest, Workload
from diagnose.requests import select
from diagnose.signals.cost import COST_BASE, per_unit, recorded_price
from diagnose.signals.observed import BEHIND_MIN, observed_workload

if TYPE_CHECKING:
    from diagnose.analysis import Analysis

PCTS = (50, 90, 99)


def server_warmth(a: Analysis) -> str | None:
    """'cold (N requests served before the capture)' or 'warm (...)', from server_requests_before_capture: cold
    under the threshold ``cold_server_requests`` the analysis judged by (VAL005 reads it too); None without the
    server's counter."""
    sig = a.signals.get("server_requests_before_capture")
    if sig is None or not np.isfinite(sig.value):
        return None
    limit = a.thresholds.get("cold_server_requests")
    if limit is None:  # an Analysis built without the pipeline (a test's): the shipped default
        from diagnose.rules.spec import load_thresholds

        limit = load_thresholds()["cold_server_requests"]
    n = int(sig.value)
    return f"{'cold' if n < limit else 'warm'} ({n} requests served before the capture)"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) else None


def _pcts(values: Any) -> dict[str, float] | None:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not v.size:
        return None
    return {f"p{p}": float(np.percentile(v, p)) for p in PCTS}


def _arrival(wl: Workload) -> str:
    mode, replay = wl.mode, wl.replay
    if mode == "replay" and replay is not None:
        speed, loop = _num(replay.speed) or 1.0, int(_num(replay.loop) or 1)
        sessions = int(_num(replay.sessions) or 0)
        return ("recorded offsets" + (f", {speed:g}x speed" if speed != 1 else "")
                + (f", looped {loop} times" if loop > 1 else "")
                + ((f"; {sessions} sessions, each turn sent after the previous turn's answer" if
                    wl.session_wait else f"; {sessions} sessions, turns sent at their offsets")
                   if sessions else ""))
    turns = int(_num(wl.turns) or 1)
    if mode == "concurrency" and turns > 1:  # tasks (attach --turns)
        think, retries = _num(wl.think_time_s) or 0.0, int(_num(wl.retries) or 0)
        return (f"closed loop of tasks: {turns} turns each, a turn sent when the "
                f"previous answer arrived" + (f" + {think:g} s think time" if think else "")
                + (f", a failed turn retried up to {retries} time{'s' if retries > 1 else ''}" if retries else ""))
    if mode == "concurrency":
        return "closed loop (each request sent when one ends)"
    if mode == "rate":
        arr = str(wl.arrival or "poisson")
        b = _num(wl.burstiness)
        return f"open loop, {arr}" + (f" (burstiness {b:g})" if arr == "gamma" and b is not None else "")
    if mode == "observe":
        return "the server's own traffic (not sent by diagnose)"
    if mode == "readiness":  # diagnose readiness: each check sends its own way (docs/readiness.md)
        return ("the readiness checks' own: streams held open and aborted, requests one at a time, an open-loop "
                "ramp past the capacity, clients retrying through a crash (one phase per check and step)")
    return "unknown"


def _dataset(manifest: Manifest, wl: Workload) -> dict[str, Any] | None:
    """A dataset run's summary (``attach --dataset``; the manifest's ``workload.dataset``) with how its lengths
    were known: ``lengths`` "measured by the server's /tokenize" or "estimated (...)", from the load probe."""
    ds = wl.dataset
    if ds is None:
        return None
    out: dict[str, Any] = asdict(ds)
    how = manifest.probe_detail("load").get("dataset_lengths")
    if isinstance(how, dict):
        out["lengths"] = ("measured by the server's /tokenize" if how.get("source") == "tokenize" else
                          f"an estimate: {how.get('note') or '4 characters a token'}")
    return out


def _lengths(wl: Workload) -> dict[str, Any] | None:
    """The length distributions a synthetic run drew from (``--input-tokens``/``--output-tokens``; the manifest's
    ``workload.input_lengths``/``output_lengths``), each as one phrase, with the seed: None when both lengths
    were fixed."""
    from diagnose.capture.lengths import LengthDist

    got = {"input": LengthDist.from_json(wl.input_lengths), "output": LengthDist.from_json(wl.output_lengths)}
    if not any(got.values()):
        return None
    out: dict[str, Any] = {}
    for what, dist in got.items():
        fixed = _num(wl.input_tokens if what == "input" else wl.output_tokens)
        out[what] = dist.describe() if dist is not None else (f"{fixed:.0f} (fixed)" if fixed is not None else None)
        if dist is not None:
            out[f"{what}_spec"] = dist.text
    out["seed"] = wl.seed
    return out


def workload_card(a: Analysis, price: float | None = None) -> dict[str, Any] | None:
    """The card of a bundle's analysis; None for an input that is no capture (a kernel trace, a span file).
    ``price``: the price per hour to cost the run at (``analyze --cost-per-hour``), else the one the capture
    recorded. The pipeline computes it once (``Analysis.workload_card``); views only show it."""
    wl = a.meta.workload
    if wl is None:
        return None
    mode = str(wl.mode or "unknown")
    replay = wl.replay
    source = ("observed traffic" if mode == "observe" else
              f"replay of {replay.file} ({replay.format})" if mode == "replay" and replay else
              "synthetic")
    dataset = _dataset(a.meta, wl) if mode not in ("replay", "observe") else None
    if dataset is not None:
        source = (f"dataset {dataset['file']} ({dataset['format']}): {dataset['conversations']} records"
                  + (f", {dataset['multi_turn']} of them conversations of several turns (each turn sent after "
                     "the previous answer)" if dataset.get("multi_turn") else "")
                  + (f"; input lengths {dataset['lengths']}" if dataset.get("lengths") else ""))
    lengths = _lengths(wl) if mode not in ("replay", "observe") else None
    if lengths is not None:
        source += "; " + "; ".join(f"{what} tokens {d}" for what, d in (("input", lengths.get("input")),
                                                                     ("output", lengths.get("output"))) if d)
        source += f"; drawn with seed {lengths['seed']}"
    sig = a.signals

    def s(name: str) -> float | None:
        return sig[name].value if name in sig else None

    card: dict[str, Any] = {
        "mode": mode, "source": source, "arrival": _arrival(wl),
        "levels": [str(p.name) for p in wl.phases if p.role != "baseline"],
        "api": wl.api, "ignore_eos": wl.ignore_eos,
        "logprobs": wl.logprobs,  # attach --logprobs N: alternatives asked with every token (None: none asked)
        "rate_rps": s("request_rps"), "concurrency_mean": s("client_in_flight_mean"),
        "arrival_gap_cv": s("arrival_gap_cv_ratio"),
        "requests": None, "input_tokens": None, "input_tokens_planned": None, "output_tokens": None,
        "prefix_share_planned": None, "cached_token_share": None,
        # cold and warm apart: the server's state when the capture began, and the first requests' TTFT against
        # the rest of their phase (the same requests as ttft_cold_ratio)
        "warmth": {"server": server_warmth(a), "ttft_cold_p50_ms": s("ttft_cold_p50_ms"),
                   "ttft_warm_p50_ms": s("ttft_warm_p50_ms")},
    }
    if lengths is not None:
        card["lengths"] = lengths
    if dataset is not None:
        card["dataset"] = dataset
    if mode == "replay" and replay:
        card["prefix_share_planned"] = _num(replay.prefix_share)
        card["replay"] = {k: getattr(replay, k) for k in ("file", "format", "requests", "skipped", "speed", "loop",
                                                          "span_s", "block_tokens", "sessions")}
    elif mode != "observe":
        card["prefix_share_planned"] = _num(wl.shared_prefix_fraction)
    req = a.tables.get("requests")
    if req is not None and not req.empty:
        base = {p.phase for p in a.phases if p.is_baseline}
        sent = req[~req["phase"].isin(base)] if base and "phase" in req.columns else req
        # the requests the statistics count (diagnose.requests.select, the one rule: warm-up, a profiler's
        # window and client stalls left out), so the card's count is the tables' and requests_measured's
        rows = select(req, a.run_window).counted if a.run_window is not None else sent
        card["requests_sent"] = int(len(sent))

        def col(name: str) -> np.ndarray:
            """A column as floats; NaN where the table (a report test's, an older bundle's) lacks it."""
            return rows[name].to_numpy(dtype=float) if name in rows.columns else np.full(len(rows), np.nan)

        card["requests"] = int(len(rows))
        card["input_tokens"] = _pcts(col("prompt_tokens"))  # the server's usage count where it gave one
        card["input_tokens_planned"] = _pcts(col("prompt_tokens_planned"))  # the lengths the client asked for
        card["output_tokens"] = _pcts(col("output_tokens"))
        # how faithfully the load was sent: the schedule lag (capped requests left out) and the input lengths
        # the server counted over those planned (1.0: as asked; only where the server reports usage)
        planned, served = col("prompt_tokens_planned"), col("prompt_tokens")
        both = np.isfinite(planned) & np.isfinite(served) & (planned > 0)
        asked, got = col("max_tokens"), col("output_tokens")
        ok = rows["ok"].to_numpy(dtype=bool) if "ok" in rows.columns else np.zeros(len(rows), dtype=bool)
        out_both = ok & np.isfinite(asked) & np.isfinite(got) & (asked > 0)
        card["fidelity"] = {
            "schedule_lag_p99_ms": s("client_schedule_lag_p99_ms"),
            "input_served_over_planned_p50": float(np.median(served[both] / planned[both])) if both.any() else None,
            # the output lengths served over those asked (max_tokens), successful requests: 1.0 as recorded
            "output_served_over_asked_p50": (float(np.median(got[out_both] / asked[out_both]))
                                             if out_both.any() else None)}
        cached, prompt = col("cached_tokens"), col("prompt_tokens")
        known = np.isfinite(cached) & np.isfinite(prompt)
        if known.any() and prompt[known].sum() > 0:
            card["cached_token_share"] = float(cached[known].sum() / prompt[known].sum())
    price = price if price is not None else recorded_price(a.meta)
    if price is not None:  # what the run cost (diagnose/signals/cost.py): one definition, compare's too
        slo = a.meta.options.slo
        per = {name: per_unit(price, s(base) or 0.0, scale) for name, (base, scale) in COST_BASE.items()}
        card["cost"] = {"price_per_hour": price, "per_mtok": _num(per["cost_per_mtok"]),
                        "per_request": _num(per["cost_per_request"]),
                        "per_good_request": _num(per["cost_per_good_request"]) if slo else None}
    if mode == "observe" or card["requests"] is None:  # the server's counters, where there are no client rows
        card["server"] = {"output_tps": s("server_output_tps"), "running_mean": s("running_requests_mean"),
                          "prefix_cache_hit_ratio": s("prefix_cache_hit_ratio")}
        seen = observed_workload(a.tables, a.run_window) if a.run_window is not None else None
        if seen is not None:
            _observed(card, seen, s("running_requests_mean"), s("queue_depth_mean"))
        else:
            card["note"] = ("no per-request rows and no finished-requests counter: rate and lengths unknown "
                            "(see docs/workload.md)")
    elif s("prefix_cache_hit_ratio") is not None:
        card["server"] = {"prefix_cache_hit_ratio": s("prefix_cache_hit_ratio")}
    return card


def _observed(card: dict[str, Any], seen: dict[str, Any], running: float | None, waiting: float | None) -> None:
    """Fill an observe-mode card from the server's telemetry (diagnose/signals/observed.py): rate, lengths with the
    buckets that bound their percentiles, prefix-cache hit ratio as the prefix share's lower bound."""
    card["requests"] = int(round(seen["requests"]))
    card["rate_rps"] = seen["rate_rps"]
    if seen.get("arrival_rps") is not None:
        card["arrival_rps"] = seen["arrival_rps"]
    if running is not None:
        card["concurrency_mean"] = running + (waiting or 0.0)
    spans = seen.get("spans")
    card["lengths_from"] = f"engine spans ({spans['requests']} requests)" if spans else "server histograms"
    for key in ("input_tokens", "output_tokens"):
        d = (spans or seen).get(key)
        if d:
            card[key] = {f"p{p}": d[f"p{p}"] for p in PCTS if f"p{p}" in d}
            card[f"{key}_mean"] = d["mean"]
            if not spans:  # exact from spans; from buckets, each percentile with the bucket it lies in
                card[f"{key}_bounds"] = {f"p{p}": d[f"p{p}_bucket"] for p in PCTS if f"p{p}_bucket" in d}
    card["prefix_share_observed"] = seen.get("prefix_cache_hit_ratio")
    card["arrival_dispersion"] = seen.get("dispersion")
    card["observed"] = {k: seen.get(k) for k in ("seconds", "prompt_tps", "output_tps", "interval_s")}
    card["note"] = ("from the server's counters and " + (
        "the engine's request spans: rate exact; lengths exact per request" if spans else
        "histograms: rate exact; length means exact, percentiles interpolated in the buckets shown") +
        "; prefix share = the prefix-cache hit ratio (a lower bound of the repeated share: evicted prefixes and "
        "first requests count as misses)")
    behind = fell_behind(seen)
    if behind:
        card["note"] += "; " + behind


def fell_behind(seen: dict[str, Any]) -> str | None:
    """A sentence when more requests arrived than finished over the observation (by more than BEHIND_MIN): the
    rate is then the server's throughput, not the offered load. The counts and rates are the card's own rows
    (each number once a page)."""
    came, done, inside = seen.get("arrived"), seen.get("requests"), seen.get("in_server")
    if came is None or not done or inside is None or came <= done * (1 + BEHIND_MIN):
        return None
    return (f"the server fell behind: requests in it rose from {inside[0]:.0f} to {inside[1]:.0f} over the "
            "observation; the counter's rate is its throughput, the arrival rate the offered load")
