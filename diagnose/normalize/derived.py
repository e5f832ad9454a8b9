"""Signals derived from other sources' signals: SLO ratios and baseline / load-trend comparisons.

The reference for "high" and "normal": the SLO when the user gave one (``*_over_slo_ratio``); otherwise
the run's own baseline (``*_vs_baseline_ratio``): the baseline phase (sequential requests at concurrency
1 that ``attach`` sends first), or the lowest load level of a sweep. "Top" is the highest load level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from diagnose.io.manifest import Manifest
from diagnose.model import Phase, Signal
from diagnose.signals.catalog import SIGNALS

SLO_METRICS = ("ttft", "itl", "tpot", "e2e")
PCTS = ("p50", "p90", "p95", "p99", "max")


def _sig(name: str, value: float, unit: str = "ratio") -> Signal:
    return Signal(name=name, value=float(value), unit=unit, source="derived", description=SIGNALS.get(name, ""))


def _val(sigs: Mapping[str, Signal], name: str) -> float | None:
    s = sigs.get(name)
    if s is None or not s.is_finite():
        return None
    return float(s.value)


def _load(p: Phase) -> float | None:
    if p.is_baseline:
        return p.concurrency or 1.0
    return p.level


def slo_terms(manifest: Manifest) -> dict[str, float]:
    """The SLO the capture recorded ('ttft_p99_ms' -> limit); {} when none. A limit that is not positive (or
    null) is left out: no SLO is judged on it (the manifest reader refuses one that is not a number)."""
    return {k: float(v) for k, v in manifest.options.slo.items() if v is not None and v > 0}


def worst_slo_ratio(sigs: Mapping[str, Signal], slo: Mapping[str, float], metric: str | None = None) -> float | None:
    ratios = []
    for key, limit in slo.items():
        if metric is not None and not key.startswith(metric + "_"):
            continue
        v = _val(sigs, key)
        if v is not None:
            ratios.append(v / limit)
    return max(ratios) if ratios else None


def _reference(out: dict[str, Signal], bs: Mapping[str, Signal]) -> None:
    for key, name in (("ttft_p50_ms", "baseline_ttft_p50_ms"), ("itl_p50_ms", "baseline_itl_p50_ms")):
        b = _val(bs, key)
        if b is not None:
            out[name] = _sig(name, b, "ms")


def signals(run: Mapping[str, Signal], phases: Sequence[Phase],
            per_phase: Mapping[int, Mapping[str, Signal]], slo: Mapping[str, float]) -> dict[str, Signal]:
    """The signals derived from others; ``slo``: the capture's SLO terms (:func:`slo_terms`)."""
    out = _signals(run, phases, per_phase, slo)
    out.update(itl_split(run, out))
    out.update(kv_demand(run))
    out.update(context_wanted(run))
    return out


def context_wanted(run: Mapping[str, Signal]) -> dict[str, Signal]:
    """``context_wanted_tokens``: the context setting that would let the requests finish as asked: prompt +
    max_tokens (means) for one sequence; on an engine whose context is split between fixed slots (llama.cpp:
    ``slot_context_tokens`` known) that times the slots (max_num_seqs), since ``--ctx-size`` is their total."""
    prompt, asked = _val(run, "prompt_tokens_mean"), _val(run, "output_tokens_asked_mean")
    overflow = _val(run, "error_context_request_tokens")  # what the rejected requests needed (no request finished)
    if (prompt is None or asked is None) and overflow is None:
        return {}
    one = prompt + asked if prompt is not None and asked is not None else float(overflow or 0.0)
    what = f"{prompt:.0f} + {asked:.0f}" if prompt is not None and asked is not None else \
        f"{one:.0f} (the rejected requests' prompt + max_tokens)"
    slots = _val(run, "max_num_seqs") if _val(run, "slot_context_tokens") is not None else None
    sig = _sig("context_wanted_tokens", one * (slots or 1), "tokens")
    how = (f"({what}) tokens x {slots:.0f} slots" if slots else f"{what} tokens for one sequence")
    return {sig.name: replace(sig, description=f"{sig.description} ({how})")}


def kv_demand(run: Mapping[str, Signal]) -> dict[str, Signal]:
    """``kv_demand_ratio``: the KV tokens the engine's peak of running requests would hold at their full length
    (running_requests_max x (prompt_tokens_mean + output_tokens_mean)) over the cache's capacity. Above 1 the
    cache cannot finish the requests the engine runs at once (SCH005: the cache is too small for them); well
    below 1 their sequences fit, so preemptions come from elsewhere. ``kv_offered_demand_ratio``: the same for
    the requests the client kept in flight (client_in_flight_mean), the load offered (SCH009: a cache too
    small for it holds the batch below its cap). Each is left out without the capacity, its count or the
    lengths."""
    cap = _val(run, "kv_capacity_tokens")
    prompt, output = _val(run, "prompt_tokens_mean"), _val(run, "output_tokens_mean")
    if cap is None or prompt is None or output is None or cap <= 0:
        return {}
    out: dict[str, Signal] = {}
    for name, count, what in (("kv_demand_ratio", "running_requests_max", "running"),
                              ("kv_offered_demand_ratio", "client_in_flight_mean", "in flight")):
        n = _val(run, count)
        if n is None or n <= 0:
            continue
        need = n * (prompt + output)
        sig = _sig(name, need / cap)
        out[name] = replace(sig, description=f"{sig.description} ({n:.3g} {what} x ({prompt:.0f} + {output:.0f}) "
                                             f"tokens = {need:.0f} against {cap:.0f})")
    return out


def itl_split(run: Mapping[str, Signal], derived: Mapping[str, Signal]) -> dict[str, Signal]:
    """Where the median token's time went: the client's ITL P50 split into a decode step alone (the
    baseline's ITL P50: one request, no other sequence or prefill chunk in its steps), the engine under load
    (the server's ITL P50 above that: the batch, prefill chunks and preemption sharing the steps) and the
    rest (client ITL P50 above the server's: API server streaming, network, client). Shares of the larger of
    the two medians, so they add up to 1; the server's P50 comes from its histogram, and the description
    gives the engine share's range over the P50's bucket."""
    client, server = _val(run, "itl_p50_ms"), _val(run, "server_itl_p50_ms")
    decode = _val(derived, "baseline_itl_p50_ms")
    if client is None or server is None or decode is None or client <= 0 or server <= 0:
        return {}
    total = max(client, server)
    step = min(decode, server)
    lo, hi = _val(run, "server_itl_p50_bucket_lo_ms"), _val(run, "server_itl_p50_bucket_hi_ms")
    rng = ""
    if lo is not None and hi is not None and hi >= lo:
        a, b = (max(0.0, min(x, total) - min(decode, x)) / total for x in (lo, hi))
        rng = f"; with the server's P50 anywhere in its bucket [{lo:.3g}, {hi:.3g}] ms: {a:.0%}-{b:.0%}"
    how = (f" (client ITL P50 {client:.3g} ms, server {server:.3g} ms, the baseline's decode step {decode:.3g} ms)")
    out = {}
    for name, v, extra in (("itl_split_decode_ratio", step / total, ""),
                           ("itl_split_engine_load_ratio", (server - step) / total, rng),
                           ("itl_split_outside_ratio", max(0.0, client - server) / total, "")):
        sig = _sig(name, v)
        out[name] = replace(sig, description=sig.description + how + extra)
    return out


def _signals(run: Mapping[str, Signal], phases: Sequence[Phase],
             per_phase: Mapping[int, Mapping[str, Signal]], slo: Mapping[str, float]) -> dict[str, Signal]:
    out: dict[str, Signal] = {}
    for metric in SLO_METRICS:
        r = worst_slo_ratio(run, slo, metric)
        if r is not None:
            out[f"{metric}_over_slo_ratio"] = _sig(f"{metric}_over_slo_ratio", r)

    baseline = [p for p in phases if p.is_baseline]
    measured = [p for p in phases if not p.is_baseline and _load(p) is not None]
    if baseline:  # the reference itself, whatever the load after it (a replay's phase has no load level)
        _reference(out, per_phase.get(baseline[0].phase, {}))
    if not measured:
        return out
    top = max(measured, key=lambda p: (_load(p) or 0.0, p.phase))
    if top.level_kind == "concurrency" and top.concurrency is not None:
        out["offered_concurrency"] = _sig("offered_concurrency", float(top.concurrency), "requests")
    if baseline:
        base = baseline[0]
    elif len(measured) > 1:
        base = min(measured, key=lambda p: (_load(p) or 0.0, p.phase))
    else:
        return out
    if base is top:
        return out
    bs = per_phase.get(base.phase, {})
    ts = per_phase.get(top.phase, {})
    for name, key in (("ttft", "ttft_p50_ms"), ("itl", "itl_p50_ms"), ("tps", "output_tps")):
        b, t = _val(bs, key), _val(ts, key)
        if b is not None and t is not None and b > 0:
            out[f"{name}_vs_baseline_ratio"] = _sig(f"{name}_vs_baseline_ratio", t / b)
    if not baseline:  # no baseline phase: the sweep's lowest level is the reference
        _reference(out, bs)
    lb, lt = _load(base), _load(top)
    if base.level_kind != top.level_kind:
        # an open loop at N req/s against a concurrency-1 baseline: compare like with like, the requests each
        # phase actually kept in flight (time-weighted, Little's law), never a rate against a concurrency
        lb, lt = _val(bs, "client_in_flight_mean"), _val(ts, "client_in_flight_mean")
    if lb and lt and math.isfinite(lb) and lb > 0:
        how = ("requests in flight (time-weighted)" if base.level_kind != top.level_kind
               else f"offered {top.level_kind or 'load'}")
        sig = _sig("load_vs_baseline_ratio", lt / lb)
        out[sig.name] = replace(sig, description=f"{sig.description}: {how} at {top.name} / at {base.name}")
    if slo:
        rt, rb = worst_slo_ratio(ts, slo), worst_slo_ratio(bs, slo)
        if rt is not None:
            out["tail_slo_ratio_top"] = _sig("tail_slo_ratio_top", rt)
        if rb is not None:
            out["tail_slo_ratio_bottom"] = _sig("tail_slo_ratio_bottom", rb)
    return out
