"""The workload of traffic diagnose did not send (``attach --observe``), from the server's own telemetry
(issue 16, item 2; docs/workload.md "Observed traffic").

An observe-mode bundle has no request rows: what the traffic was comes from the server's counters and
histograms over the capture, never from prompt text:

* rate: the finished-requests counter's increase over the time its scrapes cover (exact);
* input and output lengths: the per-request token histograms (vLLM ``request_prompt_tokens`` and
  ``request_generation_tokens``; TGI's input-length and generated-tokens histograms). Their means are exact
  (``_sum / _count``); percentiles lie in the bucket named with them (vLLM's buckets run 1-2-5 per decade, so a
  128-token P50 is only known to lie in (100, 200]) and the value given is interpolated in it;
* prefix sharing: the prefix-cache hit ratio (hit tokens / queried tokens). It equals the share of each prompt
  that repeats only when every repeated prefix stays cached; an evicted prefix or a first request counts as a
  miss, so it is a lower bound of the repeated share;
* requests in the server: waiting + running, time-weighted (Little's law) where the histograms allow;
* arrivals: the finished count plus the change of waiting + running over each scrape interval (the gauges
  are read in the same scrape as the counter). At steady load they equal the finished count; a server that
  fell behind finished fewer than arrived (CI, a slow host: 58 finished in 16 s while the driver sent 4 a
  second, 64), and the finished rate alone understated the offered load by 10%;
* arrival pattern: the index of dispersion of the finished requests per scrape interval against the mean rate
  (1 for Poisson arrivals, under 1 for evenly spaced ones, over 1 for bursts; intervals of unequal length
  allowed for), at the scrape interval's resolution;
* with the engine's request spans (``attach --observe --otlp``; vLLM's ``llm_request`` carries
  ``gen_ai.usage.prompt_tokens`` and ``completion_tokens``) covering at least ``SPAN_COVERAGE_MIN`` of the
  requests the counter saw: each request's lengths exactly, and its arrival time (the spans of the requests
  that finished in the window, as the counter and the histograms count them).

:func:`observed_requests` turns the same figures into a replayable workload (diagnose's JSONL): arrivals at the
scrape intervals' arrival counts (finished counts where the gauges are missing), spread evenly in each
interval; lengths drawn from the histograms at evenly spaced quantiles and scaled so their totals equal the
``_sum`` (so the replay sends the token rates the server saw); input and output lengths paired at random (the
histograms do not say which went together); one prefix group whose blocks (of the server's KV block size)
cover the hit ratio's share of the input tokens. With the engine's spans, arrivals and paired lengths are the
spans' own.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pandas as pd

from diagnose.analysis import Window
from diagnose.capture.workload import ReplayRequest
from diagnose.normalize.prom_hist import monotone
from diagnose.normalize.prometheus import (
    counter_increase,
    counter_intervals,
    hist_mean,
    hist_quantile,
    hist_window,
)
from diagnose.requests import percentiles

LENGTHS = {"input_tokens": "request_prompt_tokens", "output_tokens": "request_output_tokens"}
PCTS = (50, 90, 99)
# the engine's request spans (attach --observe --otlp) stand for the traffic when they cover this share of the
# requests its counter saw finish: then lengths are exact per request and arrivals are the spans' own
SPAN_COVERAGE_MIN = 0.9
IN_SERVER = ("queue_depth", "running_requests")  # waiting + running: the requests inside the server
BEHIND_MIN = 0.10  # arrivals beyond the finished count by more than this share: the server fell behind


def in_server(tables: dict[str, pd.DataFrame]) -> pd.Series | None:
    """Requests in the server (waiting + running, data-parallel series added) at each scrape that read both
    gauges, indexed by scrape time ``t_s``; None without them."""
    df = tables.get("metrics")
    if df is None or df.empty:
        return None
    g = df[df["signal"].isin(IN_SERVER)].dropna(subset=["value"])
    if g.empty:
        return None
    both = g.groupby("t_s")["signal"].nunique() == len(IN_SERVER)
    total = g.groupby("t_s")["value"].sum()
    total = total[both.reindex(total.index, fill_value=False)]
    return total if len(total) else None


def arrivals(inside: pd.Series | None, per: pd.DataFrame) -> np.ndarray | None:
    """Requests that arrived in each of ``per``'s scrape intervals (the finished-requests counter's): the
    finished count plus the change of requests in the server over the interval, never below 0. A request
    aborted before it finished arrives and leaves without the finished counter seeing it, so it is not
    counted. ``inside``: :func:`in_server`'s series. None where a gauge misses a scrape."""
    if inside is None or per.empty:
        return None
    at = inside.reindex(pd.Index(np.concatenate([per["t0_s"].to_numpy(float), per["t_s"].to_numpy(float)])))
    if at.isna().any():
        return None
    n = len(per)
    change = at.to_numpy(float)[n:] - at.to_numpy(float)[:n]
    return np.maximum(per["delta"].to_numpy(float) + change, 0.0)


def span_requests(tables: dict[str, pd.DataFrame], window: Window) -> pd.DataFrame:
    """The engine's request spans that *finished* in ``window`` with both token counts, in arrival order:
    columns ``start_s`` (the engine's arrival time), ``prompt_tokens``, ``completion_tokens``.

    By finish, as the finished-requests counter and the length histograms count them: the card's requests and
    their lengths are one population. By arrival, the long requests that arrived before the window were left
    out, and the last arrivals' spans, exported after they finish, came after the receiver's drain on a loaded
    server (engine tier on a slow host: 53 spans for 64 arrivals), so the lengths leaned to short requests."""
    cols = ["start_s", "prompt_tokens", "completion_tokens"]
    rb = tables.get("request_breakdown")
    need = {"server_start_s", "server_e2e_ms", "prompt_tokens", "completion_tokens"}
    if rb is None or rb.empty or not need <= set(rb.columns):
        return pd.DataFrame(columns=cols)
    t = pd.to_numeric(rb["server_start_s"], errors="coerce")
    end = t + pd.to_numeric(rb["server_e2e_ms"], errors="coerce") / 1e3
    inp = pd.to_numeric(rb["prompt_tokens"], errors="coerce")
    out = pd.to_numeric(rb["completion_tokens"], errors="coerce")
    keep = end.between(window.start_s, window.end_s) & (inp >= 1) & (out >= 1)
    df = pd.DataFrame({"start_s": t[keep], "prompt_tokens": inp[keep], "completion_tokens": out[keep]})
    return df.sort_values("start_s").reset_index(drop=True)


def _dispersion(per: pd.DataFrame) -> float | None:
    """Index of dispersion of the finished requests per scrape interval, for intervals of unequal length
    (the probe stretches its interval under its overhead budget): sum((count - rate x length)^2) / sum(rate x
    length), scaled by n / (n - 1). 1 for Poisson arrivals, under 1 for evenly spaced ones, over 1 for bursts.
    The plain variance / mean of the counts would read unequal intervals as bursts."""
    counts = per["delta"].to_numpy(dtype=float)
    dt = (per["t_s"] - per["t0_s"]).to_numpy(dtype=float)
    if len(counts) < 3 or counts.sum() <= 0 or dt.sum() <= 0:
        return None
    expected = counts.sum() / dt.sum() * dt
    return float(((counts - expected) ** 2).sum() / expected.sum() * len(counts) / (len(counts) - 1))


def _scraped(window: Window, per: pd.DataFrame) -> Window:
    """The part of ``window`` the counters cover (from the first to the last scrape of the intervals in
    ``per``): spans are taken over the same time as the requests the counter counted."""
    if per.empty:
        return window
    return Window(max(window.start_s, float(per["t0_s"].min())), min(window.end_s, float(per["t_s"].max())))


def traffic_spans(tables: dict[str, pd.DataFrame], window: Window,
                  per: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """The engine's request spans, over the time the finished-requests counter covers (``per``: its
    intervals, read here when not given), when they stand for the traffic: at least ``SPAN_COVERAGE_MIN`` of
    the requests the counter saw. None otherwise (no spans, or too few exported)."""
    per = counter_intervals(tables, "finished_requests", window) if per is None else per
    n = float(per["delta"].sum()) if len(per) else 0.0
    sp = span_requests(tables, _scraped(window, per))
    return sp if n > 0 and len(sp) >= SPAN_COVERAGE_MIN * n else None


def _hit_ratio(tables: dict[str, pd.DataFrame], window: Window) -> float | None:
    """Prefix-cache hit tokens over queried tokens in the window; None without queries."""
    queries = counter_increase(tables, "prefix_cache_queries_tokens", window)
    hits = counter_increase(tables, "prefix_cache_hits_tokens", window)
    return hits / queries if queries and hits is not None else None


def _exact(values: np.ndarray) -> dict[str, float]:
    return {"mean": float(values.mean()), **percentiles(values, tuple((f"p{p}", float(p)) for p in PCTS))}


def _rate(c: pd.DataFrame) -> tuple[float, float] | None:
    """(increase, seconds its scrape intervals cover) of one counter's intervals; None without two scrapes."""
    span = float((c["t_s"] - c["t0_s"]).sum()) if len(c) else 0.0
    return (float(c["delta"].sum()), span) if span > 0 else None


def _lengths(tables: dict[str, pd.DataFrame], signal: str, window: Window) -> dict[str, Any] | None:
    mean = hist_mean(tables, signal, window)
    if mean is None:
        return None
    out: dict[str, Any] = {"mean": mean[0], "count": mean[1]}
    for p in PCTS:
        est = hist_quantile(tables, signal, p / 100, window)
        if est is not None:
            out[f"p{p}"] = est.value
            out[f"p{p}_bucket"] = [est.lo, est.bound if math.isfinite(est.bound) else None]
    return out


def observed_workload(tables: dict[str, pd.DataFrame], window: Window) -> dict[str, Any] | None:
    """The observed traffic's figures over ``window`` (see the module text); None without the server's
    finished-requests counter (llama.cpp has none)."""
    per = counter_intervals(tables, "finished_requests", window)
    finished = _rate(per)
    if finished is None:
        return None
    n, span = finished
    out: dict[str, Any] = {"requests": n, "seconds": span, "rate_rps": n / span}
    inside = in_server(tables)
    came = arrivals(inside, per)
    if came is not None and inside is not None:
        out["arrived"] = float(came.sum())
        out["arrival_rps"] = float(came.sum()) / span
        out["in_server"] = [float(inside[float(per["t0_s"].iloc[0])]), float(inside[float(per["t_s"].iloc[-1])])]
    for key, sig in LENGTHS.items():
        out[key] = _lengths(tables, sig, window)
    for key, sig in (("prompt_tps", "prompt_tokens"), ("output_tps", "generation_tokens")):
        r = _rate(counter_intervals(tables, sig, window))
        out[key] = r[0] / r[1] if r else None
    out["prefix_cache_hit_ratio"] = _hit_ratio(tables, window)
    out["dispersion"] = _dispersion(per)
    out["interval_s"] = float((per["t_s"] - per["t0_s"]).median())
    sp = traffic_spans(tables, window, per)
    if sp is not None:
        out["spans"] = {"requests": len(sp), "input_tokens": _exact(sp["prompt_tokens"].to_numpy(dtype=float)),
                        "output_tokens": _exact(sp["completion_tokens"].to_numpy(dtype=float))}
    return out


def _draw(tables: dict[str, pd.DataFrame], signal: str, window: Window, n: int) -> list[int] | None:
    """``n`` integer lengths with the histogram's distribution (evenly spaced quantiles, each in its bucket)
    whose total is the histogram's ``_sum`` scaled to ``n`` (the exact token count when ``n`` is its count).
    The lengths are moved within their buckets to meet the total: the true lengths do, so a solution exists."""
    les, cum = hist_window(tables, signal, window)
    mean = hist_mean(tables, signal, window)
    if not les or not cum or cum[-1] <= 0 or mean is None or n < 1:
        return None
    counts = np.asarray(monotone(cum), dtype=float)
    uppers = np.asarray(les, dtype=float)
    lowers = np.concatenate([[0.0], uppers[:-1]])
    prev = np.concatenate([[0.0], counts[:-1]])
    ranks = (np.arange(n) + 0.5) / n * counts[-1]
    idx = np.minimum(np.searchsorted(counts, ranks, side="left"), len(counts) - 1)
    width = counts[idx] - prev[idx]
    frac = np.where(width > 0, (ranks - prev[idx]) / np.where(width > 0, width, 1.0), 1.0)
    lo, hi = lowers[idx], uppers[idx]
    span = np.where(np.isinf(hi), np.maximum(lo, 1.0), hi - lo)  # the +Inf bucket: as wide as its lower bound
    vals = lo + span * frac
    # integer bounds of each bucket (lo, hi]; lengths are at least 1 token
    a = np.maximum(1, np.floor(lo).astype(np.int64) + 1)
    b = np.where(np.isinf(hi), np.iinfo(np.int64).max // 4, np.floor(np.where(np.isinf(hi), 0, hi))).astype(np.int64)
    b = np.maximum(a, b)
    ints = np.clip(np.rint(vals).astype(np.int64), a, b)
    residue = int(round(mean[0] * n)) - int(ints.sum())
    for _ in range(4):  # proportional to the room each length has in its bucket, then one token at a time
        if residue == 0:
            break
        room = (b - ints) if residue > 0 else (ints - a)
        total_room = int(room.sum())
        if total_room <= 0:
            break
        step = np.floor(abs(residue) * room / total_room).astype(np.int64)
        step = np.minimum(step, room)
        ints += step if residue > 0 else -step
        residue -= int(step.sum()) if residue > 0 else -int(step.sum())
        order = np.argsort(-room)
        for j in order[:abs(residue)]:
            if room[j] > step[j]:
                ints[j] += 1 if residue > 0 else -1
        residue = int(round(mean[0] * n)) - int(ints.sum())
    return [int(v) for v in ints]


def _shared_blocks(inputs: list[int], hit: float, block_tokens: int) -> list[int]:
    """Each prompt's shared blocks, so that together they cover ``hit`` of the input tokens: a prompt's share
    in blocks, the rounding error carried on to the next prompt (with blocks as large as a CPU engine's 128
    tokens, rounding each prompt alone would miss the ratio by a whole block's worth). A prompt keeps at least
    one token of its own."""
    out, carry = [], 0.0
    for i in inputs:
        want = hit * i / block_tokens + carry
        k = max(0, min(int(want + 0.5), (i - 1) // block_tokens))
        carry = want - k
        out.append(k)
    return out


def observed_requests(tables: dict[str, pd.DataFrame], window: Window, block_tokens: int,
                      seed: int = 0) -> tuple[list[ReplayRequest], str]:
    """A replayable workload of the observed traffic (see the module text) and a note saying how it was made.
    Raises ValueError, naming what is missing, when the server's telemetry cannot give one."""
    per = counter_intervals(tables, "finished_requests", window)
    if per.empty or per["delta"].sum() < 1:
        raise ValueError("the server's finished-requests counter did not move during the capture (no traffic "
                         "seen, or an engine without that counter)")
    hit = min(1.0, max(0.0, _hit_ratio(tables, window) or 0.0))
    group = f"observed-{seed}"
    sp = traffic_spans(tables, window, per)
    if sp is not None:
        # the engine's own spans: each request's arrival and lengths as they were, paired
        inp = [int(v) for v in sp["prompt_tokens"]]
        t0 = float(sp["start_s"].iloc[0])
        reqs = [ReplayRequest(offset_s=float(t) - t0, input_tokens=i, output_tokens=int(o),
                              prefix=tuple(f"{group}:{j}" for j in range(k)))
                for t, i, o, k in zip(sp["start_s"], inp, sp["completion_tokens"],
                                      _shared_blocks(inp, hit, block_tokens), strict=True)]
        return reqs, (f"from observed traffic: {len(reqs)} requests at the arrival times and with the lengths of "
                      f"the engine's request spans, prefix share {hit:.0%} from its prefix-cache hit ratio")
    times: list[float] = []
    came = arrivals(in_server(tables), per)
    counts = came if came is not None else per["delta"].to_numpy(float)
    if counts.sum() < 1:
        raise ValueError("no request arrived during the capture: the server only finished those already in it")
    for t0, t1, d in zip(per["t0_s"], per["t_s"], counts, strict=True):
        k = int(round(d))
        times.extend(t0 + (t1 - t0) * (i + 0.5) / k for i in range(k))
    n = len(times)
    lengths = {key: _draw(tables, sig, window, n) for key, sig in LENGTHS.items()}
    missing = [key for key, v in lengths.items() if v is None]
    if missing:
        raise ValueError(f"the server exposes no per-request length histogram for {' and '.join(missing)} "
                         "(vLLM: vllm:request_prompt_tokens / vllm:request_generation_tokens)")
    inp, out = lengths["input_tokens"] or [], lengths["output_tokens"] or []
    rng = random.Random(seed)
    rng.shuffle(inp)
    rng.shuffle(out)
    t_first = times[0]
    reqs = [ReplayRequest(offset_s=t - t_first, input_tokens=i, output_tokens=o,
                          prefix=tuple(f"{group}:{j}" for j in range(k)))
            for t, i, o, k in zip(times, inp, out, _shared_blocks(inp, hit, block_tokens), strict=True)]
    counted = "arrivals (finished + change in waiting and running)" if came is not None else "finished counts"
    note = (f"from observed traffic: {n} requests at the server's {counted} per scrape interval, lengths "
            f"drawn from its length histograms (totals exact), prefix share {hit:.0%} from its prefix-cache hit "
            "ratio; inputs and outputs paired at random")
    return reqs, note
